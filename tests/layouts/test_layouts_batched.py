"""Large layouts are applied in bounded batches outside one long write lock (issue 11, finding 7).

Each batch is its own transaction, so the reconcile tick's heartbeat write gets in between
batches; a partially applied layout is always a prefix of fleet, domains, slots, models, pointer.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from bench.layout_apply import big_layout
from fleets.base import clock
from fleets.base.errors import LayoutError
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, ModelBinding, Slot
from fleets.services import layouts as layouts_service
from fleets.services.heartbeats import domain_seen
from fleets.services.layouts import layout_apply, layout_rows
from fleets.services.leases import lease_acquire, lease_release
from fleets.services.operations import operation_request

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_batches(settings):
    settings.HARU = {**settings.HARU, "layout_batch_rows": 40, "layout_batch_pause_ms": 0}


@pytest.mark.django_db
def test_a_new_fleet_is_written_in_batches_with_its_pointer_last(small_batches):
    layout = parse_layout(big_layout("big", 150))
    seen: list[tuple[int, int, bool, int]] = []

    def on_batch(done: int, total: int) -> None:
        fleet = Fleet.objects.get(slug="big")
        seen.append((done, total, fleet.active_domain_id is not None, ModelBinding.objects.count()))

    report = layout_apply(layout=layout, on_batch=on_batch)
    rows = layout_rows(layout)  # 2 domains + 6 slots + 300 models
    assert rows == 308
    assert report.batches == len(seen) == seen[-1][1] >= rows // 40
    # Models grow batch by batch; the pointer appears only once every row is in.
    counts = [c for *_, c in seen]
    assert counts == sorted(counts) and counts[0] < counts[-1] == 300
    assert [pointed for _, _, pointed, _ in seen] == [False] * (len(seen) - 1) + [True]
    fleet = Fleet.objects.get(slug="big")
    assert fleet.active_domain.slug == "east" and fleet.route_revision == 1
    assert Slot.objects.filter(domain__fleet=fleet, state="serving").count() == 3
    assert Slot.objects.filter(domain__fleet=fleet, state="sleeping").count() == 3
    assert Event.objects.filter(fleet=fleet, kind="layout.applied").count() == 1
    # Re-applying the same file changes nothing.
    again = layout_apply(layout=layout)
    assert not again.created and not again.updated and len(again.unchanged) == rows + 1


@pytest.mark.django_db
def test_a_layout_over_the_row_limit_is_refused_with_nothing_written(settings):
    settings.HARU = {**settings.HARU, "layout_max_rows": 100}
    with pytest.raises(LayoutError) as err:
        layout_apply(layout=parse_layout(big_layout("big", 60)))
    assert "126 rows" in str(err.value) and "HARU_LAYOUT_MAX_ROWS" in str(err.value)
    assert not Fleet.objects.filter(slug="big").exists()
    # A dry run is refused the same way.
    with pytest.raises(LayoutError):
        layout_apply(layout=parse_layout(big_layout("big", 60)), dry_run=True)


@pytest.mark.django_db
def test_a_dry_run_writes_nothing_and_reports_the_difference(small_batches):
    report = layout_apply(layout=parse_layout(big_layout("big", 60)), dry_run=True)
    assert len(report.created) == 1 + 2 + 4 + 120 and report.batches == 0
    assert not Fleet.objects.exists() and not ModelBinding.objects.exists()


@pytest.mark.django_db
def test_a_second_apply_of_the_same_fleet_is_refused_while_one_runs():
    now = clock.now()
    assert lease_acquire(
        name="layout:big", holder="other-host:1", now=now, ttl=timedelta(seconds=60)
    )
    with pytest.raises(LayoutError) as err:
        layout_apply(layout=parse_layout(big_layout("big", 10)))
    assert "being applied by other-host:1" in str(err.value)
    assert not Fleet.objects.filter(slug="big").exists()
    lease_release(name="layout:big", holder="other-host:1")
    layout_apply(layout=parse_layout(big_layout("big", 10)))
    assert ModelBinding.objects.count() == 20


@pytest.mark.django_db
def test_a_prune_stops_when_an_operation_starts_between_its_batches(small_batches):
    data = big_layout("big", 100)
    layout_apply(layout=parse_layout(data))
    fleet = Fleet.objects.get(slug="big")
    smaller = big_layout("big", 10)
    calls: list[int] = []

    def on_batch(done: int, total: int) -> None:
        calls.append(done)
        if done == 2:  # the first prune batch is committed; start an operation
            operation_request(fleet=fleet, kind="promote", target_domain_id="west", actor="test")

    with pytest.raises(LayoutError) as err:
        layout_apply(layout=parse_layout(smaller), prune=True, on_batch=on_batch)
    assert "operation is in flight" in str(err.value)
    assert err.value.batches_written == 2
    left = ModelBinding.objects.filter(domain__fleet=fleet).count()
    assert 20 < left < 200  # the first prune batch went, the rest was refused


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_write_gets_in_between_batches_of_a_large_apply(small_batches):
    # Runs on SQLite by default and on PostgreSQL with DATABASE_URL (CI runs both). The re-apply
    # changes the fleet's policy and every domain's name (rows the tick also writes) and adds
    # models; between two batches another connection's heartbeat write must go through at once.
    data = big_layout("big", 20)
    layout_apply(layout=parse_layout(data))
    fleet = Fleet.objects.get(slug="big")
    east = Domain.objects.get(fleet=fleet, slug="east")
    bigger = big_layout("big", 300)
    bigger["policy"] = {"heartbeatStaleMs": 9000}
    for d in bigger["domains"]:
        d["displayName"] = d["slug"].upper()
    written: list[bool] = []
    errors: list[BaseException] = []

    def beat() -> None:
        try:
            written.append(
                domain_seen(
                    domain_id=east.id, fleet_id=fleet.id, seen_at=clock.now(), report={"ok": 1}
                )
            )
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)
        finally:
            connection.close()

    def on_batch(done: int, total: int) -> None:
        if done == 1:
            assert connection.in_atomic_block is False
            t = threading.Thread(target=beat)
            t.start()
            t.join(5)
            assert not t.is_alive(), "the heartbeat write waited for the apply"

    report = layout_apply(layout=parse_layout(bigger), on_batch=on_batch)
    assert report.batches > 3
    assert not errors and written == [True]
    assert Domain.objects.get(pk=east.id).last_report.get("ok") == 1
    assert ModelBinding.objects.filter(domain__fleet=fleet).count() == 600


@pytest.mark.integration
def test_the_layout_benchmark_prints_its_figures():
    # bench/layout_apply.py runs in its own process on its own temporary SQLite file.
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "layout_apply.py"),
            "--models",
            "120",
            "--batch",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == {"one-batch", "no-pause", "batched"}
    assert "batches=   1" in lines["one-batch"] and "batches=   5" in lines["batched"]
    assert "longest_writer_wait=" in lines["batched"]


@pytest.mark.django_db
def test_seed_layout_reports_its_batches_and_refuses_an_oversized_layout(
    settings, small_batches, tmp_path
):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big_layout("big", 60)))
    out, err = io.StringIO(), io.StringIO()
    call_command("seed_layout", "--config", str(path), stdout=out, stderr=err)
    assert "batch 1/4 written" in err.getvalue() and "batch 4/4 written" in err.getvalue()
    assert "applied layout" in out.getvalue()
    settings.HARU = {**settings.HARU, "layout_max_rows": 50}
    path.write_text(json.dumps(big_layout("other", 60)))
    with pytest.raises(CommandError, match="refused, nothing written:\n.*HARU_LAYOUT_MAX_ROWS"):
        call_command("seed_layout", "--config", str(path))
    assert not Fleet.objects.filter(slug="other").exists()


@pytest.mark.django_db
def test_seed_layout_says_how_far_an_interrupted_apply_got(small_batches, tmp_path, monkeypatch):
    layout_apply(layout=parse_layout(big_layout("big", 100)))
    fleet = Fleet.objects.get(slug="big")
    path = tmp_path / "small.json"
    path.write_text(json.dumps(big_layout("big", 10)))
    real = layouts_service._refuse_prune
    calls = []

    def refuse_the_second_time(*args, **kwargs):
        # An operation appears between the first and the second prune batch.
        calls.append(1)
        if len(calls) == 3:  # the plan, the first prune batch, then this one
            operation_request(fleet=fleet, kind="promote", target_domain_id="west", actor="t")
        return real(*args, **kwargs)

    monkeypatch.setattr(layouts_service, "_refuse_prune", refuse_the_second_time)
    with pytest.raises(CommandError, match=r"stopped after 2 batch\(es\) were written; re-apply"):
        call_command("seed_layout", "--config", str(path), "--prune")
