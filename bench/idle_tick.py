"""Benchmark what one idle tick of a two-domain fleet costs: CPU, SQL statements, rows written.

    .venv/bin/python bench/idle_tick.py [--samples 20] [--interval 5] [--json] [-v]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/haru .venv/bin/python bench/idle_tick.py

Starts two simulated GPU hosts (`haru.local.supervisors.SimHost`: a real supervisor, two sim
engines and a sim trainer each, over the real wire), seeds a fleet of them with the default
policy (east active and serving, west asleep with its trainer running), ticks it until it is
idle, then measures `--samples` idle ticks, each under the fleet's tick lease (`tick_run`, as the
loop and Celery run it), `--interval` seconds apart on the control plane's clock (the clock is
moved on instead of slept, so a run takes seconds; the hosts do not read it).

Per tick: CPU (this process's `time.process_time`, all threads: the heartbeat pools' HTTP work
included), SQL statements (every statement the tick's connection sends, through Django's
`execute_wrapper`), and rows written (the row counts of INSERT, UPDATE and DELETE), with the lease
table's statements and rows counted apart. Prints the medians and maxima, and each statement
grouped by verb and table, so a redesign can see what it costs.

SQLite: a fresh database file in a temporary directory. PostgreSQL (`DATABASE_URL` or
`--database-url`): a scratch database created beside the one named, migrated, and dropped at the
end; the one named is not touched.

`measure_idle_tick(fleet_id=...)` is the function other benchmarks import (`bench/scale.py`): it
measures a fleet that already exists in a process where Django is set up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEASE_TABLE = "fleets_lease"
_VERB = re.compile(r"^\s*(\w+)", re.S)
_TABLES = re.compile(r'\b(?:FROM|JOIN|UPDATE|INTO)\s+"?(\w+)"?', re.I)
WRITES = ("INSERT", "UPDATE", "DELETE")


def statement_label(sql: str) -> str:
    """Name a statement by its verb and tables ("SELECT fleets_domain+fleets_slot")."""
    verb_match = _VERB.match(sql)
    verb = verb_match.group(1).upper() if verb_match else "?"
    tables = list(dict.fromkeys(_TABLES.findall(sql)))
    return f"{verb} {'+'.join(tables)}".strip()


@dataclass
class TickCost:
    """What one tick sent to the database, and the CPU it took."""

    cpu_ms: float = 0.0
    statements: int = 0
    lease_statements: int = 0
    rows_written: int = 0  # not counting the lease table
    lease_rows: int = 0
    groups: Counter = field(default_factory=Counter)
    other_threads: int = 0  # statements sent from threads other than the tick's
    sites: Counter = field(default_factory=Counter)  # label and the Haru code that sent it
    supervisor_cpu_ms: float = 0.0  # of which: the supervisor calls (their threads' CPU)


def _call_site() -> str:
    """The innermost frames of Haru's own code that sent a statement (`file:function`)."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None and len(frames) < 2:
        path = frame.f_code.co_filename
        if f"{os.sep}fleets{os.sep}" in path and "site-packages" not in path:
            frames.append(f"{Path(path).stem}.{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(frames) or "?"


class _Recorder:
    """An `execute_wrapper` counting every statement and the rows each write touched."""

    def __init__(self, *, where: bool = False) -> None:
        self.cost = TickCost()
        self.where = where
        self.returning: list[tuple[Any, bool]] = []
        self._thread = threading.get_ident()

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001 - Django's signature
        result = execute(sql, params, many, context)
        label = statement_label(sql)
        lease = LEASE_TABLE in label
        cost = self.cost
        cost.groups[label] += 1
        if self.where:
            cost.sites[f"{label}  <- {_call_site()}"] += 1
        if threading.get_ident() != self._thread:
            cost.other_threads += 1
        if lease:
            cost.lease_statements += 1
        else:
            cost.statements += 1
        if label.split(" ", 1)[0] in WRITES:
            if "RETURNING" in sql.upper() and context["connection"].vendor == "sqlite":
                # SQLite counts a RETURNING statement's rows as they are fetched: read it when
                # the tick is over.
                self.returning.append((context["cursor"], lease))
            else:
                self._count(context["cursor"].rowcount, lease=lease)
        return result

    def _count(self, rowcount: int | None, *, lease: bool) -> None:
        rows = max(0, rowcount or 0)
        if lease:
            self.cost.lease_rows += rows
        else:
            self.cost.rows_written += rows

    def finish(self) -> None:
        for cursor, lease in self.returning:
            self._count(cursor.rowcount, lease=lease)
        self.returning.clear()


class _CallCpu:
    """The CPU the supervisor client's calls take, in whatever thread they run (thread time)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self._lock = threading.Lock()

    @contextmanager
    def installed(self) -> Iterator[_CallCpu]:
        from fleets.reconciler.supervisor.client import SupervisorClient  # noqa: PLC0415

        originals = {name: getattr(SupervisorClient, name) for name in ("status", "gpu_memory")}

        def timed(original: Callable) -> Callable:
            def call(client: Any, **kwargs: Any) -> Any:
                started = time.thread_time()
                try:
                    return original(client, **kwargs)
                finally:
                    with self._lock:
                        self.ms += (time.thread_time() - started) * 1000

            return call

        for name, original in originals.items():
            setattr(SupervisorClient, name, timed(original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(SupervisorClient, name, original)

    def take(self) -> float:
        with self._lock:
            taken, self.ms = self.ms, 0.0
        return taken


@contextmanager
def _recording(*, where: bool = False) -> Iterator[_Recorder]:
    from django.db import connection  # noqa: PLC0415 - Django is set up by the caller

    recorder = _Recorder(where=where)
    with connection.execute_wrapper(recorder):
        started = time.process_time()
        yield recorder
        recorder.cost.cpu_ms = (time.process_time() - started) * 1000
    recorder.finish()


class SkippingClock:
    """The real clock plus an offset that `skip` moves on: ticks `interval` apart without
    waiting for it (the simulated hosts keep real time; only the control plane's clock skips)."""

    def __init__(self) -> None:
        self._offset = 0.0

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self._offset)

    def monotonic(self) -> float:
        return time.monotonic() + self._offset

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def skip(self, seconds: float) -> None:
        self._offset += seconds


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else 0.0


def measure_idle_tick(
    *,
    fleet_id: Any,
    interval_s: float = 5.0,
    samples: int = 20,
    settle_ticks: int = 6,
    client_factory: Callable | None = None,
    skip_time: bool = True,
) -> dict[str, Any]:
    """Measure `samples` idle ticks of one fleet (Django set up, its hosts answering).

    Ticks it `settle_ticks` times first (mirroring what the hosts report), then each sample
    under the fleet's lease, `interval_s` apart: on a clock moved on (`skip_time`, the default:
    this process's clock is swapped for the run) or slept. Returns the medians and maxima; the
    headline figures (`idle_tick_cpu_ms` the median, the counts the maximum over the samples).
    A fleet with an operation in flight after settling is not idle: ValueError.
    """
    from fleets.base import clock  # noqa: PLC0415 - needs django.setup()
    from fleets.core.states import IN_FLIGHT_OPERATION_STATES  # noqa: PLC0415 - needs django.setup()
    from fleets.models import Operation  # noqa: PLC0415 - needs django.setup()
    from fleets.reconciler.tick import tick_run  # noqa: PLC0415 - needs django.setup()

    kwargs: dict[str, Any] = {"fleet_id": fleet_id}
    if client_factory is not None:
        kwargs["client_factory"] = client_factory
    skipper = SkippingClock() if skip_time else None
    previous = clock.set_clock(skipper) if skipper is not None else None  # type: ignore[arg-type]

    def wait() -> None:
        if skipper is not None:
            skipper.skip(interval_s)
        else:
            time.sleep(interval_s)

    costs: list[TickCost] = []
    calls = _CallCpu()
    try:
        for _ in range(settle_ticks):
            tick_run(**kwargs)
            wait()
        if Operation.objects.filter(
            fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES
        ).exists():
            raise ValueError(f"fleet {fleet_id} is not idle: an operation is in flight")
        with calls.installed():
            for _ in range(samples):
                calls.take()
                with _recording() as recorder:
                    result = tick_run(**kwargs)
                if not result.ran:
                    raise ValueError(f"fleet {fleet_id}: the tick did not run (lease held)")
                recorder.cost.supervisor_cpu_ms = calls.take()
                costs.append(recorder.cost)
                wait()
        # One more idle tick naming the code behind each statement (walking the stack costs
        # CPU, so it is not one of the samples).
        with _recording(where=True) as recorder:
            tick_run(**kwargs)
        sites = recorder.cost.sites
    finally:
        if skipper is not None:
            clock.set_clock(previous)  # type: ignore[arg-type]

    groups: Counter = Counter()
    for cost in costs:
        groups.update(cost.groups)
    n = max(1, len(costs))
    total_statements = [c.statements + c.lease_statements for c in costs]
    return {
        "interval_s": interval_s,
        "samples": len(costs),
        "idle_tick_cpu_ms": _median([c.cpu_ms for c in costs]),
        "idle_tick_cpu_ms_p90": round(
            sorted(c.cpu_ms for c in costs)[int(0.9 * (len(costs) - 1))], 3
        )
        if costs
        else 0.0,
        # Lease included: what the target counts.
        # Of the CPU: the supervisor calls (HTTP, the wire contract's check, parsing).
        "supervisor_calls_cpu_ms": _median([c.supervisor_cpu_ms for c in costs]),
        "idle_tick_statements": max(total_statements, default=0),
        "idle_tick_statements_median": _median([float(s) for s in total_statements]),
        "lease_statements_per_tick": max((c.lease_statements for c in costs), default=0),
        "rows_written_per_idle_heartbeat": max((c.rows_written for c in costs), default=0),
        "rows_written_per_idle_heartbeat_mean": round(sum(c.rows_written for c in costs) / n, 3),
        "lease_rows_per_tick": max((c.lease_rows for c in costs), default=0),
        # Idle ticks that wrote no row besides the lease's (the rest record a sighting).
        "ticks_writing_no_row": sum(1 for c in costs if c.rows_written == 0),
        "statements_from_other_threads": sum(c.other_threads for c in costs),
        # Statements per tick by verb and table, averaged over the samples.
        "statement_groups": {label: round(count / n, 2) for label, count in groups.most_common()},
        # One idle tick's statements by verb, table and the Haru functions that sent them.
        "statement_sites": dict(sites.most_common()),
    }


# -- the command line: its own database, two simulated hosts, one fleet ------------------------


def _scratch_postgres(url: str) -> tuple[str, Callable[[], None]]:
    """Create an empty database beside the one `url` names; return its URL and its dropper."""
    import psycopg  # noqa: PLC0415 - only for PostgreSQL runs

    base = url.rsplit("/", 1)[0]
    name = f"haru_bench_idle_{os.getpid()}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        from django.db import connections  # noqa: PLC0415 - Django is set up by now

        connections.close_all()
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{base}/{name}", drop


def _setup_django(workdir: Path, database_url: str | None) -> None:
    os.environ.pop("REDIS_URL", None)
    os.environ["HARU_VAR_DIR"] = str(workdir / "var")
    os.environ["DJANGO_SETTINGS_MODULE"] = "haru.settings"
    from haru.local.supervisors import TOKEN  # noqa: PLC0415 - no Django needed

    os.environ["HARU_SUPERVISOR_TOKEN"] = TOKEN  # the simulated hosts' token
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    import django  # noqa: PLC0415 - after the environment above selects the settings

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415 - needs django.setup()

    call_command("migrate", "--noinput", verbosity=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-idle-"))
    url = args.database_url or os.environ.get("DATABASE_URL") or None
    drop: Callable[[], None] | None = None
    if url:
        url, drop = _scratch_postgres(url)
    _setup_django(workdir, url)
    from django.db import connection  # noqa: PLC0415 - needs django.setup()

    from fleets.layouts.loader import parse_layout  # noqa: PLC0415 - needs django.setup()
    from fleets.models import Fleet  # noqa: PLC0415 - needs django.setup()
    from fleets.services.layouts import layout_apply  # noqa: PLC0415 - needs django.setup()
    from haru.local.supervisors import SimHost, put_in_standby_posture  # noqa: PLC0415

    east = SimHost("east", workdir)
    west = SimHost("west", workdir, start_asleep=True)
    try:
        east.start()
        west.start()
        put_in_standby_posture(west)
        layout = {
            "slug": "idle",
            "activeDomainSlug": "east",
            "domains": [east.layout_domain(10), west.layout_domain(20)],
        }
        layout_apply(layout=parse_layout(layout), actor="bench")
        fleet = Fleet.objects.get(slug="idle")
        if not fleet.domains.exists():
            raise RuntimeError("the layout seeded no domains")
        figures = measure_idle_tick(
            fleet_id=fleet.id, interval_s=args.interval, samples=args.samples
        )
        return {"database": connection.vendor, **figures}
    finally:
        east.stop()
        west.stop()
        if drop is not None:
            drop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="idle ticks measured")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between ticks")
    parser.add_argument("--database-url", help="PostgreSQL server (default: DATABASE_URL)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("-v", action="store_true", help="print the statement groups")
    args = parser.parse_args()
    figures = run(args)
    print(
        f"database: {figures['database']}  interval: {figures['interval_s']} s  "
        f"samples: {figures['samples']}"
    )
    for key in (
        "idle_tick_cpu_ms",
        "idle_tick_cpu_ms_p90",
        "supervisor_calls_cpu_ms",
        "idle_tick_statements",
        "idle_tick_statements_median",
        "lease_statements_per_tick",
        "rows_written_per_idle_heartbeat",
        "rows_written_per_idle_heartbeat_mean",
        "lease_rows_per_tick",
        "ticks_writing_no_row",
        "statements_from_other_threads",
    ):
        print(f"  {key}: {figures[key]}")
    if args.v or not args.json:
        print("  statements per tick, by verb and table:")
        for label, count in figures["statement_groups"].items():
            print(f"    {count:6.2f}  {label}")
        if args.v:
            print("  one idle tick's statements, by the code that sent them:")
            for site, count in figures["statement_sites"].items():
                print(f"    {count:3d}  {site}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
