"""Where one `/metrics` scrape's CPU goes at N fleets: each database collector, and the writer.

    .venv/bin/python bench/metrics_scrape.py --fleets 1000 [--repeats 3] [--json]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/haru .venv/bin/python bench/metrics_scrape.py

Populates a scratch database as `bench/scale_reads.py` does (its `--fleets` two-domain fleets,
bench/fleet_population.py), then, `--repeats` times inside one scrape scope (the collectors
share their reads as in a real scrape): each database collector's CPU milliseconds and samples,
and the CPU of writing the text twice from the same families, with Haru's writer
(fleets/metrics/exposition.py, what `/metrics` uses) and with prometheus_client's
`generate_latest`, checking that both wrote the same bytes. Figures are medians, this
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
    return {
        "collectors": {
            name: {"cpu_ms": round(statistics.median(cpu[name]), 1), "samples": samples[name]}
            for name in samples
        },
        "collect_cpu_ms": round(sum(statistics.median(cpu[name]) for name in samples), 1),
        "render_cpu_ms": round(statistics.median(cpu["render"]), 1),
        "generate_latest_cpu_ms": round(statistics.median(cpu["generate_latest"]), 1),
        "samples": sum(samples.values()),
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
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
