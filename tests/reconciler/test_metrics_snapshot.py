"""`/metrics` at many fleets (issue 27): the database's series from the host's snapshot.

The same series as a scrape that computes them, no statement while the snapshot is fresh, its
age exported, never older than three periods, a failed refresh keeps the last figures and is
counted, one computation at a time on a host, and below the threshold every scrape is exact.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_population import populate
from fleets.metrics import placement, snapshot
from fleets.metrics.registry import _database_collectors
from fleets.models import Domain, Fleet

pytestmark = pytest.mark.django_db

PERIOD = 15
MIN_FLEETS = 5
_OWN = ("haru_metrics_snapshot_",)
_START_REFRESHER = snapshot.start_refresher


@pytest.fixture
def snapshots(settings, tmp_path, monkeypatch, fake_clock):
    """Snapshots on from 5 fleets, in a directory of the test's own, with no thread: a test
    refreshes with `snapshot.refresh_if_due` (a thread would read through a connection of its
    own, outside the test's transaction)."""
    settings.HARU = {
        **settings.HARU,
        "metrics_snapshot_s": PERIOD,
        "metrics_snapshot_min_fleets": MIN_FLEETS,
    }
    settings.PROMETHEUS_MULTIPROC_DIR = tmp_path
    monkeypatch.setattr(snapshot, "_state", snapshot._State())
    started: list[int] = []
    monkeypatch.setattr(snapshot, "start_refresher", lambda collectors: started.append(1))
    return started


def _series(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(_OWN):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def _scrape(client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def _refresh() -> float | None:
    return snapshot.refresh_if_due(list(_database_collectors.values()), PERIOD, MIN_FLEETS)


def test_a_snapshot_serves_the_series_a_computing_scrape_serves(snapshots, settings, client):
    populate(8, prefix="snap")
    settings.HARU = {**settings.HARU, "metrics_snapshot_s": 0}
    exact = _scrape(client)
    settings.HARU = {**settings.HARU, "metrics_snapshot_s": PERIOD}
    first = _scrape(client)  # no snapshot yet: computed in the scrape, and kept
    served = _scrape(client)  # from the snapshot
    assert _series(first) == _series(exact)
    assert _series(served) == _series(exact)
    # Every fleet's readiness, health and GPU plan are there.
    assert _value(served, "haru_failover_readiness", fleet="snap-0002") == 1
    assert _value(served, "haru_gpu_shared_count", fleet="snap-0007") is not None
    assert _value(served, snapshot.AGE) == 0
    assert _value(served, "haru_metrics_snapshot_errors_total") == 0
    assert snapshots, "the scrape served from the snapshot starts the refresh"


def test_another_process_of_the_host_serves_the_snapshot_one_computed(
    snapshots, client, monkeypatch
):
    populate(6, prefix="snap")
    computed = _scrape(client)
    monkeypatch.setattr(snapshot, "_state", snapshot._State())  # a process knowing nothing yet
    with CaptureQueriesContext(connection) as queries:
        other = _scrape(client)
    assert len(queries) == 0
    assert _series(other) == _series(computed)


def test_a_fresh_snapshot_is_served_without_a_statement_and_says_how_old(
    snapshots, client, fake_clock
):
    populate(6, prefix="snap")
    _scrape(client)
    Domain.objects.filter(fleet__slug="snap-0003").update(state="failed")
    fake_clock.advance(seconds=10)
    with CaptureQueriesContext(connection) as queries:
        stale = _scrape(client)
    assert len(queries) == 0
    assert _value(stale, "haru_domain_state", fleet="snap-0003", state="failed") is None
    assert _value(stale, snapshot.AGE) == 10
    # A period on, the refresh sees the change; the scrape still reads nothing.
    fake_clock.advance(seconds=PERIOD)
    assert _refresh() == PERIOD
    with CaptureQueriesContext(connection) as queries:
        fresh = _scrape(client)
    assert len(queries) == 0
    assert _value(fresh, "haru_domain_state", fleet="snap-0003", state="failed") == 1
    assert _value(fresh, snapshot.AGE) == 0
    # Not due again before a period: nothing computed.
    assert 0 < _refresh() <= PERIOD


def test_a_snapshot_older_than_three_periods_is_computed_again_in_the_scrape(
    snapshots, client, fake_clock
):
    populate(6, prefix="snap")
    _scrape(client)
    Domain.objects.filter(fleet__slug="snap-0004").update(state="failed")
    fake_clock.advance(seconds=snapshot.STALE_PERIODS * PERIOD)
    assert _value(_scrape(client), "haru_domain_state", fleet="snap-0004", state="failed") is None
    fake_clock.advance(seconds=1)
    text = _scrape(client)
    assert _value(text, "haru_domain_state", fleet="snap-0004", state="failed") == 1
    assert _value(text, snapshot.AGE) == 0


def test_a_failed_refresh_keeps_the_last_snapshot_and_counts_it(
    snapshots, client, fake_clock, monkeypatch
):
    populate(6, prefix="snap")
    before = _scrape(client)
    Fleet.objects.filter(slug="snap-0001").update(route_revision=77)

    def broken(self):
        raise RuntimeError("a bug in one collector")

    monkeypatch.setattr(placement.GpuPlanCollector, "_collect", broken)
    fake_clock.advance(seconds=PERIOD)
    _refresh()
    kept = _scrape(client)
    assert _value(kept, "haru_fleet_route_revision", fleet="snap-0001") != 77
    assert _series(kept) == _series(before)
    assert _value(kept, "haru_metrics_snapshot_errors_total") == 1
    assert _value(kept, snapshot.AGE) == PERIOD

    def away(self):
        raise OperationalError("connection refused")

    monkeypatch.setattr(placement.GpuPlanCollector, "_collect", away)
    fake_clock.advance(seconds=PERIOD)
    _refresh()
    down = _scrape(client)
    assert _value(down, "haru_state_store_up") == 0
    assert _value(down, "haru_metrics_snapshot_errors_total") == 2
    assert _value(down, "haru_gpu_shared_count", fleet="snap-0005") is not None  # kept


def test_below_the_threshold_every_scrape_computes_and_keeps_no_snapshot(
    snapshots, settings, client, tmp_path
):
    settings.HARU = {**settings.HARU, "metrics_snapshot_min_fleets": 100}
    populate(6, prefix="snap")
    _scrape(client)
    Domain.objects.filter(fleet__slug="snap-0003").update(state="failed")
    text = _scrape(client)
    assert _value(text, "haru_domain_state", fleet="snap-0003", state="failed") == 1
    assert _value(text, snapshot.AGE) is None
    assert not list(tmp_path.glob("*.snapshot"))
    assert not snapshots


def test_two_computations_never_run_at_once_on_a_host(snapshots, client, fake_clock, monkeypatch):
    populate(6, prefix="snap")
    _scrape(client)
    fake_clock.advance(seconds=PERIOD)
    computed: list[int] = []
    real = snapshot.compute
    monkeypatch.setattr(snapshot, "compute", lambda c: computed.append(1) or real(c))
    with snapshot._host_lock(None) as held:  # another process is computing
        assert held
        assert _refresh() == 1.0
    assert computed == []
    assert _refresh() == PERIOD
    assert computed == [1]


def test_the_refresh_thread_stops_when_nobody_scrapes(snapshots, monkeypatch):
    monkeypatch.setattr(snapshot, "start_refresher", _START_REFRESHER)
    calls: list[int] = []
    monkeypatch.setattr(snapshot, "refresh_if_due", lambda *a: calls.append(1) or 0.01)
    stopped = threading.Event()
    real_loop = snapshot._refresh_loop

    def loop(collectors):
        real_loop(collectors)
        stopped.set()

    monkeypatch.setattr(snapshot, "_refresh_loop", loop)
    snapshot._state.last_served = 0.0  # never served: idle from the start
    snapshot.start_refresher([])
    assert stopped.wait(5)
    assert calls == []


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_another_process_computing_holds_this_one_back(snapshots, client, fake_clock, monkeypatch):
    """The lock is the host's (flock on a file of the shared directory), not this process's:
    a worker of `serve --workers N` computing the snapshot keeps the others from doing it too."""
    populate(6, prefix="snap")
    _scrape(client)
    fake_clock.advance(seconds=PERIOD)
    lock = snapshot._name(snapshot.settings.PROMETHEUS_MULTIPROC_DIR).with_suffix(".lock")
    computed: list[int] = []
    real = snapshot.compute
    monkeypatch.setattr(snapshot, "compute", lambda c: computed.append(1) or real(c))
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert _refresh() == 1.0
        assert computed == []
    finally:
        child.communicate("", timeout=30)  # the child ends, and its lock with it
    assert _refresh() == PERIOD
    assert computed == [1]


def test_fleets_growing_past_the_threshold_move_the_scrapes_to_the_snapshot(
    snapshots, client, tmp_path
):
    populate(3, prefix="few")
    assert _value(_scrape(client), snapshot.AGE) is None  # computed: too few fleets
    assert not list(tmp_path.glob("*.snapshot"))
    populate(3, prefix="more")
    grown = _scrape(client)
    assert _value(grown, snapshot.AGE) == 0
    assert _value(grown, "haru_failover_readiness", fleet="more-0002") == 1
    assert list(tmp_path.glob("*.snapshot"))
    assert snapshots, "the refresh starts"
    with CaptureQueriesContext(connection) as queries:
        _scrape(client)
    assert len(queries) == 0
