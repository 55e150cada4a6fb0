"""Where one `/metrics` scrape's CPU goes at N fleets: each database collector, and the writer.

    .venv/bin/python bench/metrics_scrape.py --fleets 1000 [--repeats 3] [--json]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/haru .venv/bin/python bench/metrics_scrape.py

Populates a scratch database as `bench/scale_reads.py` does (its `--fleets` two-domain fleets,
bench/fleet_population.py), then, `--repeats` times inside one scrape scope (the collectors
share their reads as in a real scrape): each database collector's CPU milliseconds and samples,
and the CPU of writing the text twice from the same families, with Haru's writer
(fleets/metrics/exposition.py, what `/metrics` uses) and with prometheus_client's
`generate_latest`, checking that both wrote the same bytes; then what `/metrics` does at many
fleets (fleets/metrics/snapshot.py): the first scrape computes the series and keeps the host's
snapshot, the next ones serve it (their CPU and statements). Figures are medians, this
process's CPU time (the wall time on a shared machine includes waiting for a core). The whole
request, middleware included, is `metrics_ms` of `bench/scale_reads.py`. With `--json` the last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


def measure(repeats: int) -> dict[str, Any]:
    """Time the collectors and both writers `repeats` times against the populated database."""
    from prometheus_client import generate_latest  # noqa: PLC0415

    from fleets.metrics import scrape  # noqa: PLC0415
    from fleets.metrics.exposition import render  # noqa: PLC0415
    from fleets.metrics.registry import _database_collectors  # noqa: PLC0415

    cpu: dict[str, list[float]] = defaultdict(list)
    samples: dict[str, int] = {}
    for _ in range(repeats):
        families: list = []
        with scrape.scope():
            for key, collector in _database_collectors.items():
                name = key.rsplit(".", 1)[-1]
                start = time.process_time()
                got = list(collector.collect())
                cpu[name].append((time.process_time() - start) * 1000)
                samples[name] = sum(len(f.samples) for f in got)
                families += got
        start = time.process_time()
        ours = render(families)
        cpu["render"].append((time.process_time() - start) * 1000)
        start = time.process_time()
        theirs = generate_latest(_Families(families))  # type: ignore[arg-type]
        cpu["generate_latest"].append((time.process_time() - start) * 1000)
        if ours != theirs:
            raise RuntimeError("the two writers disagree")
    served = measure_snapshot(repeats)
    return {
        **served,
        "collectors": {
            name: {"cpu_ms": round(statistics.median(cpu[name]), 1), "samples": samples[name]}
            for name in samples
        },
        "collect_cpu_ms": round(sum(statistics.median(cpu[name]) for name in samples), 1),
        "render_cpu_ms": round(statistics.median(cpu["render"]), 1),
        "generate_latest_cpu_ms": round(statistics.median(cpu["generate_latest"]), 1),
        "samples": sum(samples.values()),
    }


def measure_snapshot(repeats: int) -> dict[str, Any]:
    """The database's series of one scrape as `/metrics` gets them at many fleets: the first
    scrape computes them and keeps the host's snapshot, the next ones serve it
    (fleets/metrics/snapshot.py). CPU medians and statements of a served scrape; the figures
    must be the same series as a computing scrape's (checked here)."""
    from django.conf import settings  # noqa: PLC0415
    from django.test.utils import override_settings  # noqa: PLC0415

    from fleets.metrics import snapshot  # noqa: PLC0415
    from fleets.metrics.registry import _database_collectors  # noqa: PLC0415

    collectors = list(_database_collectors.values())
    # Snapshots from the first fleet on, whatever the environment says (the settings' readers
    # are cached: override_settings tells them).
    haru = {**settings.HARU, "metrics_snapshot_s": 15, "metrics_snapshot_min_fleets": 1}
    snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)
    with override_settings(HARU=haru):
        return _served(snapshot, collectors, repeats)


def _served(snapshot: Any, collectors: list, repeats: int) -> dict[str, Any]:
    from django.conf import settings  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    try:
        start = time.process_time()
        first = snapshot.database_series(collectors)  # no snapshot yet: computed, and kept
        first_ms = (time.process_time() - start) * 1000
        cpu = []
        for _ in range(repeats):
            with CaptureQueriesContext(connection) as queries:
                start = time.process_time()
                served = snapshot.database_series(collectors)
                cpu.append((time.process_time() - start) * 1000)
        kept = snapshot.read()
        # Both the kept text, then the live series about it (its age differs).
        if kept is None or not (first.startswith(kept.body) and served.startswith(kept.body)):
            raise RuntimeError("a served scrape differs from the one that computed it")
    finally:
        snapshot.stop_refresher()
        snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)
    return {
        "snapshot_first_cpu_ms": round(first_ms, 1),
        "snapshot_served_cpu_ms": round(statistics.median(cpu), 1),
        "snapshot_served_statements": len(queries),
        "snapshot_bytes": len(served),
    }


def run(fleets: int, repeats: int) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415

    django.setup()
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import setup_test_environment  # noqa: PLC0415

    from bench.fleet_population import populate  # noqa: PLC0415
    from bench.scale_reads import _scratch_database  # noqa: PLC0415

    setup_test_environment()
    drop = _scratch_database()
    try:
        populate(fleets)
        return {
            "fleets": fleets,
            "database": connection.vendor,
            "repeats": repeats,
            **measure(repeats),
        }
    finally:
        drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", type=int, default=1000, help="fleets to populate (>= 1)")
    parser.add_argument("--repeats", type=int, default=3, help="scrapes timed")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.fleets < 1 or args.repeats < 1:
        parser.error("--fleets and --repeats must be at least 1")
    result = run(args.fleets, args.repeats)
    print(f"{result['fleets']} fleets on {result['database']}, median of {result['repeats']}:")
    for name, figures in result["collectors"].items():
        print(f"  {name:<24} {figures['cpu_ms']:>8.1f} ms CPU {figures['samples']:>7} samples")
    print(
        f"  {'all collectors':<24} {result['collect_cpu_ms']:>8.1f} ms CPU {result['samples']:>7}"
    )
    print(f"  {'text (Haru writer)':<24} {result['render_cpu_ms']:>8.1f} ms CPU")
    print(f"  {'text (generate_latest)':<24} {result['generate_latest_cpu_ms']:>8.1f} ms CPU")
    print(
        f"  {'snapshot: first scrape':<24} {result['snapshot_first_cpu_ms']:>8.1f} ms CPU "
        "(computes and keeps it)"
    )
    print(
        f"  {'snapshot: served scrape':<24} {result['snapshot_served_cpu_ms']:>8.1f} ms CPU "
        f"{result['snapshot_served_statements']:>4} statements, "
        f"{result['snapshot_bytes']} bytes"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
