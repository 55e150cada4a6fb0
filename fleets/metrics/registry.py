"""`GET /metrics`: one Prometheus exposition per replica, whatever process did the work.

Two kinds of series. Scrape-time collectors (the fleet state, step and failover histograms,
GPU placement) read the database, so any replica shows what any worker did; they register with
`register_database_collector`, not with prometheus_client's default registry (which holds
only the per-process series). Counters and histograms observed in a process (the proxy's
requests, supervisor call errors, reconcile ticks, placement refusals) use prometheus_client's
multiprocess mode: every process on this host that loaded Haru's settings writes them to files
in `settings.PROMETHEUS_MULTIPROC_DIR`, and this view sums the files. A process on another
machine (a Celery worker elsewhere) writes to its own host's directory, which this view cannot
see: there, `manage.py metrics_host` serves that host's directory alone, a scrape target of its
own (`host_registry`; deploy/prometheus/prometheus.yml).

Open like /healthz: scrapers rarely carry tokens, and it holds no secrets.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.dispatch import Signal
from django.http import HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from fleets.metrics import snapshot
from fleets.metrics.exposition import render

# Keyed by class: a module reloaded in a test run replaces its collector instead of adding one.
_database_collectors: dict[str, Collector] = {}
# prometheus_client's file names: counter_123.db, histogram_123.db, gauge_livesum_123.db, ...
_PID_FILE = re.compile(r"_(\d+)\.db$")


# Sent before each scrape this process serves: a module that batches its observations (the chat
# proxy's, fleets/metrics/requests.py) writes them out, so its own scrape is exact.
before_scrape = Signal()


def register_database_collector(collector: Collector) -> None:
    """Export `collector` (read at scrape time, not per process) on every /metrics."""
    _database_collectors[f"{type(collector).__module__}.{type(collector).__qualname__}"] = collector


class _HostFamilies:
    """The per-process series of every process on this host, summed from their files.

    A family no process has touched yet has no file: it is still declared (HELP and TYPE, no
    samples), as a single-process registry would, so dashboards and alerts see what exists.
    """

    def __init__(self, multiproc_dir: Path) -> None:
        self._files = MultiProcessCollector(None, path=str(multiproc_dir))

    def collect(self) -> Iterator[Metric]:
        seen = set()
        for family in self._files.collect():
            seen.add(family.name)
            yield family
        # This process's own metric objects declare every family; only Haru's are wanted
        # (prometheus_client's process and GC collectors describe this process alone).
        for family in REGISTRY.collect():
            if family.name.startswith("haru_") and family.name not in seen:
                yield Metric(family.name, family.documentation, family.type, family.unit)


def scrape_registry(multiproc_dir: Path) -> CollectorRegistry:
    """What one scrape renders: the host's per-process series, plus the database's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_HostFamilies(multiproc_dir))
    for collector in _database_collectors.values():
        registry.register(collector)
    return registry


def host_registry(multiproc_dir: Path) -> CollectorRegistry:
    """What a worker host's own endpoint renders: its processes' series, none of the database's.

    The database-derived series are every server replica's already; a second copy from each
    worker host would be counted twice by any `sum` over them.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_HostFamilies(multiproc_dir))
    return registry


def remove_dead_process_files(multiproc_dir: Path) -> int:
    """Delete the files of processes that no longer run; return how many went.

    Called when the server starts, so restarts do not pile up files (a dead process's counts
    vanish, which Prometheus reads as a counter reset). Files of live processes (Celery workers
    on this host, another server) are kept: deleting them would lose what those processes count
    from then on.
    """
    removed = 0
    for path in multiproc_dir.glob("*.db"):
        match = _PID_FILE.search(path.name)
        if match is None or _is_running(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def mark_this_process_dead() -> None:
    """On a worker's exit: drop its live-gauge files (its counters stay summed until restart)."""
    mark_process_dead(os.getpid(), path=str(settings.PROMETHEUS_MULTIPROC_DIR))


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def metrics_view(request):
    before_scrape.send(sender=None)
    # The same bytes as prometheus_client's generate_latest, written faster (exposition.py):
    # this host's per-process series, then the database's, computed in this scrape (one outage
    # check for all of them) or, at many fleets, the host's snapshot of them (snapshot.py).
    body = render(_HostFamilies(settings.PROMETHEUS_MULTIPROC_DIR).collect())
    body += snapshot.database_series(list(_database_collectors.values()))
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
