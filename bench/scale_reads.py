"""Time the operator's reads at N fleets: the overview page, the API's fleet list, /metrics.

    .venv/bin/python bench/scale_reads.py --fleets 1000 [--repeats 5] [--json]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/haru .venv/bin/python bench/scale_reads.py ...

The CLI creates a scratch database of its own (SQLite: a temporary file; PostgreSQL: the
database `test_haru_scale_reads` on DATABASE_URL's server, dropped and created again), migrates
it, writes `--fleets` two-domain fleets with a mix of trouble (bench/fleet_population.py), and
times each read through Django's test client, in process: the whole view, middleware and
template included, the HTTP server not. Each figure is the median of `--repeats` requests after
one warm-up, wall time and this process's CPU time (on a shared machine the wall time includes
waiting for a core); the statements each request ran are counted too (they must not grow with
the number of fleets). With `--json` the last line is one JSON object.

Reads timed (the target, issue 27: each at most 500 ms at 1,000 fleets):

- `overview_ms`: the overview's first page (`/`), as a superuser;
  `overview_filtered_ms`: `/?status=unhealthy&q=scale`, which judges every matching fleet;
- `fleet_list_ms`: `GET /v1/fleets` (first page); `fleet_list_search_ms`:
  `GET /v1/fleets?q=scale-09&status=not_ready`;
- `metrics_ms`: `GET /metrics`: at 100 fleets or more (`HARU_METRICS_SNAPSHOT_MIN_FLEETS`) the
  database's series come from the snapshot the warm-up request computed
  (fleets/metrics/snapshot.py; `bench/metrics_scrape.py` times the computation itself);
  `metrics_computed_ms` (the CLI only): the same with every scrape computing them
  (`HARU_METRICS_SNAPSHOT_S=0`, what every scrape did before the snapshot).

Interface (issue 27, for bench/scale.py): `measure_reads(client=..., repeats=...)` times the
same reads through any client with Django's test-client `get(path, **headers)` shape, against
a database that already holds the fleets (the farm's); `measure_reads_http(base_url, ...)` the
API list and /metrics of a running server over HTTP (the overview there needs a logged-in
session: pass its `sessionid` cookie).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (figure, path) of each read, in the order they are timed.
READS = (
    ("overview_ms", "/"),
    ("overview_filtered_ms", "/?status=unhealthy&q=scale"),
    ("fleet_list_ms", "/v1/fleets"),
    ("fleet_list_search_ms", "/v1/fleets?q=scale-09&status=not_ready"),
    ("metrics_ms", "/metrics"),
)
SCRATCH_DATABASE = "test_haru_scale_reads"


def _timed(get: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Median wall and CPU milliseconds (this process's) of `repeats` calls after one warm-up,
    and the last answer. On a shared machine the wall time includes waiting for a core; the
    CPU time does not (nor, on PostgreSQL, the server's own work)."""
    answer = get()
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        answer = get()
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - start) * 1000)
    return statistics.median(walls), statistics.median(cpus), answer


def measure_reads(*, client: Any, repeats: int = 5, touch: Callable[[], Any] | None = None) -> dict:
    """Time each read of `READS` through `client` (logged in as who may view every fleet);
    return `{figure: ms, figure_statements: n, ...}`. `touch`, if given, runs before each
    read (the population's heartbeats, so that no fleet goes stale while it is measured)."""
    from django.db import connection  # noqa: PLC0415 - needs Django set up
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    out: dict[str, Any] = {}
    for name, path in READS:
        if touch is not None:
            touch()
        ms, cpu_ms, response = _timed(lambda path=path: client.get(path), repeats)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}")
        with CaptureQueriesContext(connection) as queries:
            client.get(path)
        out[name] = round(ms, 1)
        out[name.removesuffix("_ms") + "_cpu_ms"] = round(cpu_ms, 1)
        out[name.removesuffix("_ms") + "_statements"] = len(queries)
    return out


def measure_reads_http(
    base_url: str, *, token: str = "", session: str = "", repeats: int = 5
) -> dict[str, float]:
    """Time the reads of a running server over HTTP (`token`: an API token for the list;
    `session`: a portal `sessionid` cookie for the overview, left out without one)."""
    import httpx  # noqa: PLC0415 - only this mode needs it

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    cookies = {"sessionid": session} if session else {}
    out: dict[str, float] = {}
    with httpx.Client(base_url=base_url, headers=headers, cookies=cookies, timeout=30) as http:
        for name, path in READS:
            if (path.startswith("/?") or path == "/") and not session:
                continue
            ms, _cpu_ms, response = _timed(lambda path=path: http.get(path), repeats)
            if response.status_code != 200:
                raise RuntimeError(f"GET {path} answered {response.status_code}")
            out[name] = round(ms, 1)
    return out


def _metrics_computed(client: Any, repeats: int) -> dict[str, float]:
    """`GET /metrics` with every scrape computing the database's series (no snapshot,
    `HARU_METRICS_SNAPSHOT_S=0`: what every scrape did before fleets/metrics/snapshot.py)."""
    from django.conf import settings  # noqa: PLC0415
    from django.test.utils import override_settings  # noqa: PLC0415

    with override_settings(HARU={**settings.HARU, "metrics_snapshot_s": 0}):
        ms, cpu_ms, response = _timed(lambda: client.get("/metrics"), repeats)
    if response.status_code != 200:
        raise RuntimeError(f"GET /metrics answered {response.status_code}")
    return {"metrics_computed_ms": round(ms, 1), "metrics_computed_cpu_ms": round(cpu_ms, 1)}


def _scratch_database() -> Callable[[], None]:
    """Point Django at a new, migrated scratch database; return what drops it."""
    from django.db import connection  # noqa: PLC0415

    test = connection.settings_dict.setdefault("TEST", {})
    if connection.vendor == "sqlite":
        folder = tempfile.mkdtemp(prefix="haru-scale-reads-")
        test["NAME"] = str(Path(folder) / "scale.sqlite3")
    else:
        test["NAME"] = SCRATCH_DATABASE
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)

    def drop() -> None:
        connection.creation.destroy_test_db(old_name, verbosity=0)

    return drop


def run(fleets: int, repeats: int) -> dict[str, Any]:
    """Populate a scratch database with `fleets` fleets and measure the reads."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415

    django.setup()
    from django.contrib.auth import get_user_model  # noqa: PLC0415
    from django.db import connection  # noqa: PLC0415
    from django.test import Client  # noqa: PLC0415
    from django.test.utils import setup_test_environment  # noqa: PLC0415

    from bench.fleet_population import populate, touch_heartbeats  # noqa: PLC0415

    setup_test_environment()
    drop = _scratch_database()
    try:
        start = time.perf_counter()
        populate(fleets)
        populate_s = time.perf_counter() - start
        admin = get_user_model().objects.create_superuser("scale-operator", password=None)
        client = Client()
        client.force_login(admin)
        figures = measure_reads(client=client, repeats=repeats, touch=touch_heartbeats)
        figures.update(_metrics_computed(client, repeats))
        return {
            "fleets": fleets,
            "database": connection.vendor,
            "repeats": repeats,
            "populate_s": round(populate_s, 1),
            **figures,
        }
    finally:
        # /metrics at many fleets started its snapshot's refresh thread: its connection to
        # the scratch database must go before the database does (fleets/metrics/snapshot.py).
        from django.conf import settings  # noqa: PLC0415

        from fleets.metrics import snapshot  # noqa: PLC0415

        snapshot.stop_refresher()
        # Nor may its snapshot outlive it: a scratch database of the same name made within
        # three periods would be served this one's figures.
        snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)
        drop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", type=int, default=1000, help="fleets to populate (>= 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed requests per read")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.fleets < 1 or args.repeats < 1:
        parser.error("--fleets and --repeats must be at least 1")
    result = run(args.fleets, args.repeats)
    print(
        f"{result['fleets']} fleets on {result['database']} (populated in "
        f"{result['populate_s']} s), median of {result['repeats']}:"
    )
    for name, path in READS:
        stem = name.removesuffix("_ms")
        print(
            f"  {name:<22} {result[name]:>9.1f} ms wall {result[stem + '_cpu_ms']:>9.1f} ms CPU"
            f"  {result[stem + '_statements']:>4} statements  GET {path}"
        )
    print(
        f"  {'metrics_computed_ms':<22} {result['metrics_computed_ms']:>9.1f} ms wall "
        f"{result['metrics_computed_cpu_ms']:>9.1f} ms CPU  GET /metrics, no snapshot"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
