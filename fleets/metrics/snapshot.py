"""`/metrics`' database series at many fleets: one snapshot per host, refreshed in the background.

At 1,000 fleets the series read from the database (readiness verdicts, health, the GPU plan, the
fleet rows they judge) cost about a second of CPU to compute, in 23 statements: a scrape that
computed them itself missed the 500 ms target of issue 27, and did the same work again in every
server process Prometheus reached. From `HARU_METRICS_SNAPSHOT_MIN_FLEETS` fleets (100 by
default) on, a scrape serves them from a snapshot instead, and reads nothing from the database:

- the snapshot is the rendered text of those series, kept in one file per host and database in
  `PROMETHEUS_MULTIPROC_DIR` (the directory every Haru process of the host already shares), so
  `serve --workers N` computes it once per host, not N times; a process keeps the one text it
  read last (about 2.5 MB at 1,000 fleets): nothing accumulates;
- a thread in each server process that served a snapshot refreshes it every
  `HARU_METRICS_SNAPSHOT_S` seconds (15 by default) under an exclusive lock on the host, so two
  computations never run at once on a host, and a process that finds the snapshot fresh, or the
  lock taken, computes nothing. The thread stops after a while without scrapes (nobody pays for
  series nobody reads) and the next scrape starts it again;
- a refresh that fails (the database away, or a collector's bug) keeps the last snapshot and
  counts the error (`haru_metrics_snapshot_errors_total`); `haru_state_store_up` says whether
  the last attempt could read the store;
- `haru_metrics_snapshot_age_seconds` says how old the served figures are. A snapshot older than
  three periods is never served: the scrape computes the series itself, as the first scrape on a
  host does (a staleness bound of three periods whatever happens, one period and the time of a
  computation while the refresh keeps up).

Below the threshold, and with `HARU_METRICS_SNAPSHOT_S=0`, every scrape computes the series
itself, exactly as before: small deployments (and the tests) see every change at once. The
per-process series (`registry._HostFamilies`) are never part of the snapshot: they are read from
their files at each scrape. `manage.py metrics_host` serves no database series, so no snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connections
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.metrics import scrape
from fleets.metrics.exposition import render

log = logging.getLogger(__name__)

# Live at each scrape, from the snapshot's own facts, never part of its text.
STORE_UP = "haru_state_store_up"
STORE_UP_DOC = "1 when the metrics could read the state store."
AGE = "haru_metrics_snapshot_age_seconds"
# The oldest snapshot served, in periods; an older one is recomputed in the scrape.
STALE_PERIODS = 3
# A process's refresh thread stops after this long without a scrape served from the snapshot.
IDLE_PERIODS = 20
IDLE_MIN_S = 300.0
# How long a scrape waits for another process's computation before doing its own.
LOCK_WAIT_S = 10.0
# One scrape's collectors share every fleet's rows under this key (fleets.reads.fleet_list).
_FLEET_ROWS = "fleet rows"


@dataclass(frozen=True)
class Snapshot:
    """The database's series as of `at` (Unix time), and what the refreshes since then met."""

    body: bytes  # their text, haru_state_store_up excluded
    at: float
    duration_s: float  # how long computing them took
    fleets: int
    attempted_at: float  # the last refresh tried, failed or not
    store_up: bool = True  # whether that refresh could read the store
    errors: int = 0  # refreshes that failed since this host's snapshot file was made


@dataclass(frozen=True)
class Computed:
    """One computation of the database's series."""

    families: list[Metric]
    fleets: int  # 0 when the fleet rows could not be read
    at: float
    duration_s: float
    store_down: bool
    failed: bool  # a collector could not read (store down or a bug): the result is partial


def compute(collectors: Sequence[Collector]) -> Computed:
    """Every database collector's families, read in one scrape scope (they share their reads)."""
    started = time.monotonic()
    at = clock.now().timestamp()
    with scrape.scope() as current:
        families = [family for collector in collectors for family in collector.collect()]
    rows = current.shared.get(_FLEET_ROWS)
    fleets = len(getattr(rows, "fleets", ()))
    return Computed(
        families,
        fleets,
        at,
        time.monotonic() - started,
        store_down=current.store_down,
        failed=current.store_down or bool(current.failed),
    )


def database_series(collectors: Sequence[Collector]) -> bytes:
    """The text of the database's series for one scrape: computed now, or the host's snapshot."""
    conf = haru_settings()
    period = conf.metrics_snapshot_s
    if period <= 0:
        return _exact(collectors)
    min_fleets = conf.metrics_snapshot_min_fleets
    if _state.below_min:
        # The last computation here found too few fleets to share a snapshot: compute again
        # (exact), with no file or lock in the way while that stays so.
        computed = compute(collectors)
        if computed.fleets < min_fleets:
            return _computed_text(computed.families)
        _state.below_min = False
        return _store_and_serve(computed, collectors)
    snap = read()
    now = clock.now().timestamp()
    if _servable(snap, now, period, min_fleets):
        assert snap is not None  # _servable says so
        _state.last_served = time.monotonic()
        start_refresher(collectors)
        return snap.body + live(snap, now)
    with _host_lock(LOCK_WAIT_S):
        # Another process may have computed it while this one waited.
        snap = read()
        now = clock.now().timestamp()
        if _servable(snap, now, period, min_fleets) and snap is not None:
            return snap.body + live(snap, now)
        computed = compute(collectors)
        if computed.fleets < min_fleets and not computed.failed:
            _state.below_min = True
            remove(settings.PROMETHEUS_MULTIPROC_DIR)
            return _computed_text(computed.families)
        served = _store(computed, snap)
    if served is None or computed.failed:
        # Nothing good to serve within the bound: what the store gave, as without snapshots.
        return _computed_text(computed.families)
    _state.last_served = time.monotonic()
    start_refresher(collectors)
    return served.body + live(served, clock.now().timestamp())


def _store_and_serve(computed: Computed, collectors: Sequence[Collector]) -> bytes:
    with _host_lock(LOCK_WAIT_S):
        served = _store(computed, read())
    if served is None or computed.failed:
        return _computed_text(computed.families)
    _state.last_served = time.monotonic()
    start_refresher(collectors)
    return served.body + live(served, clock.now().timestamp())


def _exact(collectors: Sequence[Collector]) -> bytes:
    with scrape.scope():
        return _computed_text(
            [family for collector in collectors for family in collector.collect()]
        )


def _computed_text(families: list[Metric]) -> bytes:
    """The text of series computed in this scrape, the snapshot's own families declared."""
    return render(families) + live(None, 0.0)


def _servable(snap: Snapshot | None, now: float, period: int, min_fleets: int) -> bool:
    return (
        snap is not None
        and snap.fleets >= min_fleets
        and -1.0 <= now - snap.at <= STALE_PERIODS * period
    )


def _store(computed: Computed, previous: Snapshot | None) -> Snapshot | None:
    """Write what `computed` makes of the host's snapshot (the caller holds the host lock)."""
    if computed.failed:
        if previous is None:
            return None
        # Keep the last figures; count the failure and say whether the store answered.
        kept = replace(
            previous,
            attempted_at=computed.at,
            store_up=not computed.store_down,
            errors=previous.errors + 1,
        )
        write(kept)
        return kept
    body = render(family for family in computed.families if family.name != STORE_UP)
    fresh = Snapshot(
        body=body,
        at=computed.at,
        duration_s=computed.duration_s,
        fleets=computed.fleets,
        attempted_at=computed.at,
        errors=previous.errors if previous is not None else 0,
    )
    write(fresh)
    return fresh


def live(snap: Snapshot | None, now: float) -> bytes:
    """The series said about the snapshot at each scrape; only declared (no sample) when the
    series were computed in the scrape, so that rules and panels name families that exist."""
    families: list[Metric] = []
    if snap is not None:
        families.append(GaugeMetricFamily(STORE_UP, STORE_UP_DOC, value=1 if snap.store_up else 0))
    about = (
        (
            AGE,
            "How old the database's series of this answer are (served from the host's snapshot).",
            None if snap is None else max(0.0, now - snap.at),
        ),
        (
            "haru_metrics_snapshot_duration_seconds",
            "How long computing the snapshot of the database's series took.",
            None if snap is None else snap.duration_s,
        ),
    )
    for name, doc, value in about:
        families.append(GaugeMetricFamily(name, doc, value=value))
    errors = CounterMetricFamily(
        "haru_metrics_snapshot_errors",
        "Refreshes of the database's series that failed (the last snapshot was kept).",
        value=None if snap is None else snap.errors,
    )
    families.append(errors)
    return render(families)


# The host's files.


def _name(directory: Path) -> Path:
    # One snapshot per database: two servers of different databases may share a host directory.
    db = connections["default"].settings_dict
    ident = f"{db.get('ENGINE')}|{db.get('HOST')}|{db.get('PORT')}|{db.get('NAME')}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return Path(directory) / f"database-series-{key}.snapshot"


def write(snap: Snapshot) -> None:
    """Replace the host's snapshot file at once (a reader sees the old one or the new one)."""
    path = _name(settings.PROMETHEUS_MULTIPROC_DIR)
    meta = {
        "at": snap.at,
        "duration_s": snap.duration_s,
        "fleets": snap.fleets,
        "attempted_at": snap.attempted_at,
        "store_up": snap.store_up,
        "errors": snap.errors,
    }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(json.dumps(meta).encode() + b"\n" + snap.body)
    os.replace(tmp, path)


def read() -> Snapshot | None:
    """The host's snapshot, or None; read again only when the file changed."""
    path = _name(settings.PROMETHEUS_MULTIPROC_DIR)
    try:
        st = path.stat()
        key = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _state.cache
        if cached is not None and cached[0] == key:
            return cached[1]
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head, _, body = data.partition(b"\n")
    try:
        meta = json.loads(head)
        snap = Snapshot(
            body=body,
            at=float(meta["at"]),
            duration_s=float(meta["duration_s"]),
            fleets=int(meta["fleets"]),
            attempted_at=float(meta["attempted_at"]),
            store_up=bool(meta["store_up"]),
            errors=int(meta["errors"]),
        )
    except (ValueError, KeyError, TypeError):
        return None  # not one of ours (or a torn write by hand): computed afresh
    _state.cache = (key, snap)
    return snap


def remove(directory: Path) -> None:
    """Delete the host's snapshot of this database (too few fleets now, or a server start)."""
    with contextlib.suppress(FileNotFoundError):
        _name(directory).unlink()
    _state.cache = None


@contextlib.contextmanager
def _host_lock(wait_s: float | None) -> Iterator[bool]:
    """Hold the host's lock on the snapshot; yield False when it was not had within `wait_s`
    (None: do not wait). A process that dies holding it releases it (flock)."""
    path = _name(settings.PROMETHEUS_MULTIPROC_DIR).with_suffix(".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + (wait_s or 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if wait_s is None or time.monotonic() >= deadline:
                    # Not had in time: the caller goes on without it (bounded wait).
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# The refresh thread of this process.


class _State:
    __slots__ = ("below_min", "cache", "last_served", "lock", "stop", "thread")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.last_served = 0.0  # monotonic time of the last scrape served from the snapshot
        self.below_min = False
        self.cache: tuple[tuple, Snapshot] | None = None


_state = _State()


def start_refresher(collectors: Sequence[Collector]) -> None:
    """Start this process's refresh thread unless it runs."""
    with _state.lock:
        if _state.thread is not None and _state.thread.is_alive():
            return
        _state.stop.clear()
        _state.thread = threading.Thread(
            target=_refresh_loop,
            args=(list(collectors),),
            name="haru-metrics-snapshot",
            daemon=True,
        )
        _state.thread.start()


def stop_refresher(timeout_s: float = 5.0) -> None:
    """Stop this process's refresh thread (tests; a daemon thread otherwise ends with it)."""
    _state.stop.set()
    thread = _state.thread
    if thread is not None:
        thread.join(timeout_s)


def _refresh_loop(collectors: list[Collector]) -> None:
    try:
        while not _state.stop.is_set():
            conf = haru_settings()
            period = conf.metrics_snapshot_s
            idle_s = max(IDLE_MIN_S, IDLE_PERIODS * period)
            if period <= 0 or time.monotonic() - _state.last_served > idle_s:
                return
            close_old_connections()  # this thread's, past its age or broken by an outage
            try:
                wait = refresh_if_due(collectors, period, conf.metrics_snapshot_min_fleets)
            finally:
                # Not held idle between refreshes (a pooled connection goes back to the pool).
                connections.close_all()  # this thread's only: they are per thread
            if wait is None:
                return  # too few fleets now: scrapes compute the series themselves
            _state.stop.wait(wait)
    except Exception:  # noqa: BLE001 - the next scrape starts another thread
        log.warning("metrics snapshot: the refresh thread stopped", exc_info=True)
    finally:
        with contextlib.suppress(Exception):
            connections.close_all()  # this thread's connections only (they are per thread)


def refresh_if_due(collectors: Sequence[Collector], period: float, min_fleets: int) -> float | None:
    """Refresh the host's snapshot if it is a period old and no other process is at it; return
    the seconds until the next check, None when the fleets are too few for a snapshot."""
    snap = read()
    now = clock.now().timestamp()
    if snap is not None and snap.attempted_at + period > now:
        return min(period, snap.attempted_at + period - now)
    with _host_lock(None) as held:
        if not held:
            return min(1.0, period)  # another process computes it
        snap = read()
        now = clock.now().timestamp()
        if snap is not None and snap.attempted_at + period > now:
            return min(period, snap.attempted_at + period - now)
        computed = compute(collectors)
        if computed.fleets < min_fleets and not computed.failed:
            remove(settings.PROMETHEUS_MULTIPROC_DIR)
            return None
        if computed.failed:
            log.warning("metrics snapshot: refresh failed, the last snapshot is kept")
        _store(computed, snap)
    return float(period)
