"""Benchmark one control plane from 10 to 1,000 fleets over the fleet farm (issue 27).

    .venv/bin/python bench/scale.py --sizes 10,100,1000 --workers 1,2 [--interval-s 5]
                                    [--seconds 60] [--json] [--plot bench/results/scale.png]
    .venv/bin/python bench/scale.py --from-json results.json --plot scale.png   # re-plot

PostgreSQL and Redis (`--database-url`, default a database `haru_scale` on 127.0.0.1:5432,
dropped and created afresh for every run; `--redis-url`, default db 9 on 127.0.0.1:6379,
flushed). For each size and worker count:

1. seed N fleets of two domains each (default policy, autoFailover on) through the layout
   service (`haru.local.farm_fleets`), each domain with its own derived supervisor token;
2. start the farm (`python -m supervisor.farm`, one process: 2N supervisors, 4N model servers);
3. measure one idle tick (`bench/idle_tick.py`'s `measure_idle_tick`, interface 1, when present)
   on one fleet, before any worker runs;
4. start the workers: one is `manage.py serve` running the reconcile loop every interval (how the
   control plane runs by default); two come from `bench/scale_workers.py` (interface 2) when
   present, else two `serve` processes running the loop;
5. after every active host has been heartbeated once, measure for `--seconds`: tick lateness
   as the hosts saw it (the gaps between `GET /v1/status` arrivals on each fleet's active,
   beyond one interval), the workers' CPU per fleet per minute (their process groups, from
   /proc), rows written and transactions per tick per fleet and the connections in use
   (PostgreSQL's pg_stat_database and pg_stat_activity), the farm's own memory and CPU;
6. time `/metrics`, the overview and the fleet list (`bench/scale_reads.py`, interface 3, when
   present; else `/metrics` and `GET /v1/fleets` here, the overview not measured);
7. inject a failover: crash one fleet's active host through the farm while four clients send
   chat requests through the proxy; detection (crash -> promotion requested), total (crash ->
   route switched), overhead (total - detection - the engines' wake latency) and failed
   requests;
8. two workers: kill one and measure the handover and the double ticks (interface 2).

Prints a table (a column per run); with `--json` the last line is one JSON object with a list
`runs`. A figure that was not measured is `None` (null), never a guess.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_measure import (  # noqa: E402
    FarmProc,
    Postgres,
    group_cpu_s,
    percentile,
    tick_lateness,
)
from common.farm_manifest import write_manifest  # noqa: E402
from haru.local import PYTHON  # noqa: E402
from haru.local.farm_fleets import fleet_slug, plan_farm, seed_farm_fleets  # noqa: E402
from haru.local.processes import NotReady, spawn, stop  # noqa: E402
from haru.local.server import Server, manage, server_env  # noqa: E402
from supervisor.farm.hosts import ENGINE  # noqa: E402

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/haru_scale"
DEFAULT_REDIS = "redis://127.0.0.1:6379/9"
# Not a secret of anything real: the key the benchmark's control plane derives tokens from.
MASTER_KEY = "scale-bench-master-key-5f2c9a7e1b3d4c6a8e0f"
# The fields, in the table's order; each run has every one (None: not measured).
FIELDS = (
    "fleets",
    "workers",
    "interval_s",
    "window_s",
    "tick_lateness_p50_s",
    "tick_lateness_p90_s",
    "tick_lateness_p99_s",
    "fleets_never_heard",
    "active_beats_per_interval",
    "cpu_s_per_fleet_minute",
    "control_plane_cpu_pct",
    "rows_written_per_tick_per_fleet",
    "transactions_per_tick_per_fleet",
    "pg_connections_max",
    "pg_connections_active_max",
    "rows_written_per_idle_heartbeat",
    "lease_rows_per_tick",
    "idle_tick_cpu_ms",
    "idle_tick_statements",
    "overview_ms",
    "fleet_list_ms",
    "metrics_ms",
    "double_ticks",
    "handover_s",
    "lease_s",
    "failover_detection_s",
    "failover_total_s",
    "failover_overhead_s",
    "failover_requests",
    "failover_failed_requests",
    "failover_failed_in_flight",
    "farm_rss_mib",
    "farm_cpu_pct",
    "seed_s",
    "settle_s",
    "notes",
)


def optional(name: str) -> ModuleType | None:
    """Another part of issue 27's benchmark (bench/<name>.py), where it has landed."""
    try:
        return importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"bench.{name}":
            raise
        return None


def setup_django(database_url: str, redis_url: str, workdir: Path) -> None:
    os.environ.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        HARU_VAR_DIR=str(workdir / "var"),
        HARU_SUPERVISOR_MASTER_KEY=MASTER_KEY,
        DJANGO_SETTINGS_MODULE="haru.settings",
    )
    os.environ.pop("HARU_SUPERVISOR_TOKEN", None)
    import django  # noqa: PLC0415 - after the environment above selects the settings

    django.setup()


class Workers:
    """The control plane of one run: one `serve` for HTTP (the proxy, /metrics, the pages; it
    runs no loop) and `count` reconcile workers, from interface 2 (`bench/scale_workers.py`:
    each a host of its own, its ticks recorded) where it has landed, else `manage.py reconcile
    --loop` processes. Measured by process group, stopped at the end."""

    def __init__(self, count: int, args: argparse.Namespace, env: dict[str, str], workdir: Path):
        self.count = count
        self.args = args
        self.env = env
        self.workdir = workdir
        self.server = Server(env, workdir / "server.log")
        self.module = optional("scale_workers")
        self.ticking: list[Any] = []  # interface 2's workers
        self.loops: list[Any] = []  # else plain `reconcile --loop` processes

    def start(self) -> None:
        self.server.spawn()
        loop_env = {
            **{k: v for k, v in self.env.items() if k != "REDIS_URL"},
            "HARU_RECONCILE_INTERVAL_MS": str(int(self.args.interval_s * 1000)),
        }
        if self.module is not None:
            self.ticking = self.module.start_workers(
                self.count,
                database_url=self.args.database_url,
                workdir=self.workdir,
                interval_ms=int(self.args.interval_s * 1000),
                lease_ms=self.lease_ms,
                env=loop_env,
            )
        else:
            for i in range(self.count):
                argv = [PYTHON, "manage.py", "reconcile", "--loop"]
                self.loops.append(spawn(argv, env=loop_env, log=self.workdir / f"loop-{i}.log"))
        self.server.wait_ready(120)

    @property
    def lease_ms(self) -> int:
        from fleets.base.conf import haru_settings  # noqa: PLC0415 - needs django.setup()

        return haru_settings().tick_lease_ms

    @property
    def url(self) -> str:
        return self.server.url

    def pgids(self) -> list[int]:
        procs = [self.server.proc, *self.loops, *(w.proc for w in self.ticking)]
        return [p.pid for p in procs if p is not None]

    def kill_one(self) -> dict[str, Any]:
        """Interface 2: double ticks, and with two workers or more the handover after one is
        killed mid-tick; nothing measured without it."""
        if self.module is None or not self.ticking:
            return {}
        victim = self.ticking[0] if self.count > 1 else None
        interval_s = self.args.interval_s
        if victim is not None:
            deadline = time.monotonic() + 2 * interval_s
            while not victim.in_flight() and time.monotonic() < deadline:
                time.sleep(0.005)
            victim.kill()
            # As bench/scale_workers.py's own run: until every fleet it ticked last is ticked
            # again, or well past one lease (then handover_s is None: starved).
            cap = time.monotonic() + self.lease_ms / 1000 + 4 * interval_s
            while time.monotonic() < cap:
                time.sleep(0.1)
                ticks = self.module.ticks_read(self.ticking)
                if self.module.handover_measure(ticks, victim).handover_s is not None:
                    break
        for worker in self.ticking:
            worker.stop()
        ticks = self.module.ticks_read(self.ticking)
        out: dict[str, Any] = {"double_ticks": self.module.double_ticks_count(ticks)}
        if victim is not None:
            handover = self.module.handover_measure(ticks, victim).handover_s
            out["handover_s"] = None if handover is None else round(handover, 3)
        return out

    def stop(self) -> None:
        for worker in self.ticking:
            with contextlib.suppress(Exception):
                worker.stop()
        for proc in self.loops:
            stop(proc, 10)
        self.server.stop()


_TEST_CLIENT_READY: list[bool] = []


def reads() -> dict[str, Any]:
    """Interface 3 (bench/scale_reads.py): the overview, the fleet list and /metrics through
    Django's test client, in this process, against the run's database while the workers tick;
    nothing measured without it."""
    module = optional("scale_reads")
    if module is None:
        return {}
    from django.contrib.auth import get_user_model  # noqa: PLC0415 - needs django.setup()
    from django.test import Client  # noqa: PLC0415 - needs django.setup()
    from django.test.utils import setup_test_environment  # noqa: PLC0415 - needs django.setup()

    if not _TEST_CLIENT_READY:
        # The test client's host name (`testserver`) allowed, once per process.
        setup_test_environment()
        _TEST_CLIENT_READY.append(True)
    admin, _ = get_user_model().objects.get_or_create(
        username="scale-operator", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(admin)
    # From 100 fleets on /metrics serves a snapshot and starts its refresh thread in this
    # process (fleets/metrics/snapshot.py): the warm-up computes it against this run's
    # database, and neither outlives the run (the next size's database has the same name).
    from django.conf import settings  # noqa: PLC0415 - needs django.setup()

    from fleets.metrics import snapshot  # noqa: PLC0415 - needs django.setup()

    snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)
    try:
        return module.measure_reads(client=client, repeats=3)
    finally:
        snapshot.stop_refresher()
        snapshot.remove(settings.PROMETHEUS_MULTIPROC_DIR)


class ChatClients:
    """Clients sending chat requests through the proxy to one fleet until stopped; each
    failure remembered with the moment its request started."""

    def __init__(self, url: str, fleet: str, model: str, threads: int = 4) -> None:
        self.url, self.fleet, self.model = url, fleet, model
        self.ok = 0
        self.failures: list[tuple[float, str]] = []  # (started, monotonic; what came back)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"X-Haru-Fleet": self.fleet}
        with httpx.Client(base_url=self.url, timeout=120, trust_env=False) as c:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    r = c.post("/v1/chat/completions", json=body, headers=headers)
                    good, why = r.status_code == 200, f"{r.status_code} {r.text[:120]}"
                except httpx.HTTPError as exc:
                    good, why = False, repr(exc)
                with self._lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failures.append((started, why))

    def start(self) -> ChatClients:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(130)


def wait(predicate: Callable[[], Any], timeout: float, what: str, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"timed out waiting for {what}")


def settle(farm: FarmProc, actives: list[str], args: argparse.Namespace, since: float) -> Any:
    """Wait until every active host is heartbeated on time (its last two arrivals within 1.5
    intervals of each other and of now); return the seconds since the workers started, or
    None when that did not happen within `--settle-s` (then the run is measured anyway)."""
    pace = 1.5 * args.interval_s

    def on_time() -> bool:
        heard, now = farm.heartbeats(), time.monotonic()
        for name in actives:
            arrivals = [t for t in heard.get(name, ()) if t >= since][-2:]
            if len(arrivals) < 2 or arrivals[1] - arrivals[0] > pace or now - arrivals[1] > pace:
                return False
        return True

    try:
        wait(on_time, args.settle_s, "every fleet heartbeated on time", every_s=args.interval_s)
    except TimeoutError:
        return None
    return round(time.monotonic() - since, 1)


def inject_failover(farm: FarmProc, url: str, fleets: int) -> dict[str, Any]:
    """Crash one fleet's active host under chat load; time the failover, count failures."""
    from fleets.base import clock  # noqa: PLC0415 - needs django.setup()
    from fleets.models import Event, Fleet, Operation  # noqa: PLC0415 - needs django.setup()

    index = fleets // 2
    slug = fleet_slug(index)
    fleet = Fleet.objects.get(slug=slug)
    clients = ChatClients(url, slug, "qwen-small").start()
    try:
        wait(lambda: clients.ok >= 8, 60, "chat requests answered before the crash")
        killed_at = clock.now()
        farm.fault(f"h{2 * index:04d}", "crash")
        # The host is down once the farm answered (it closes the sockets before it answers):
        # a request started from here on found it down.
        killed_mono = time.monotonic()
        op = wait(
            lambda: Operation.objects.filter(
                fleet=fleet,
                reason="auto_failover",
                created_at__gte=killed_at,
                routing_committed=True,
            ).first(),
            180,
            "the failover",
        )
        switched = wait(
            lambda: Event.objects.filter(operation=op, kind="fleet.route.switched").first(),
            30,
            "the route switch",
        )
        before = clients.ok
        wait(lambda: clients.ok >= before + 8, 60, "chat requests answered after the switch")
    finally:
        clients.stop()
    detection = (op.created_at - killed_at).total_seconds()
    total = (switched.created_at - killed_at).total_seconds()
    # As bench/failover_load.py counts them: a request already running on the host when it
    # died is lost with it (a request a model server accepted is never sent twice); the
    # zero-loss target is about those started after the crash.
    after = [why for started, why in clients.failures if started >= killed_mono]
    for why in after[:5]:
        print(f"  failed request (started after the crash): {why}", file=sys.stderr)
    return {
        "failover_detection_s": round(detection, 3),
        "failover_total_s": round(total, 3),
        "failover_overhead_s": round(total - detection - ENGINE["wake_latency_ms"] / 1000, 3),
        "failover_requests": clients.ok + len(clients.failures),
        "failover_failed_requests": len(after),
        "failover_failed_in_flight": len(clients.failures) - len(after),
    }


def idle_tick(fleet_id: Any, interval_s: float) -> dict[str, Any]:
    """Interface 1 (bench/idle_tick.py) on one fleet of the farm, or nothing measured."""
    module = optional("idle_tick")
    if module is None:
        return {}
    found = module.measure_idle_tick(fleet_id=fleet_id, interval_s=interval_s, samples=10)
    keys = (
        "idle_tick_cpu_ms",
        "idle_tick_statements",
        "rows_written_per_idle_heartbeat",
        "lease_rows_per_tick",
    )
    return {k: found.get(k) for k in keys}


def run_one(args: argparse.Namespace, fleets: int, workers: int, pg: Postgres) -> dict[str, Any]:
    from django.db import connections  # noqa: PLC0415 - needs django.setup()

    from fleets.models import Fleet  # noqa: PLC0415 - needs django.setup()

    row: dict[str, Any] = dict.fromkeys(FIELDS)
    row.update(fleets=fleets, workers=workers, interval_s=args.interval_s)
    workdir = Path(tempfile.mkdtemp(prefix=f"haru-scale-{fleets}x{workers}-"))
    connections.close_all()
    pg.recreate()
    import redis  # noqa: PLC0415 - only here

    redis.Redis.from_url(args.redis_url).flushdb()
    env = server_env(
        workdir,
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        HARU_SUPERVISOR_MASTER_KEY=MASTER_KEY,
    )
    manage(env, "migrate", "--noinput", "-v", "0", timeout=600)
    started = time.monotonic()
    plans = seed_farm_fleets(plan_farm(fleets))
    row["seed_s"] = round(time.monotonic() - started, 1)
    manifest = workdir / "farm.json"
    write_manifest(manifest, plans)
    farm = FarmProc(manifest, workdir)
    crew = Workers(workers, args, env, workdir)
    try:
        farm.start()
        row.update(idle_tick(Fleet.objects.get(slug=fleet_slug(0)).id, args.interval_s))
        row["lease_s"] = crew.lease_ms / 1000
        crew.start()
        actives = [p.name for i, p in enumerate(plans) if i % 2 == 0]
        since = time.monotonic()

        def all_heard() -> bool:
            heard = farm.heartbeats()
            return all(any(t >= since for t in heard.get(n, ())) for n in actives)

        # Not every fleet may ever be heard at a size the workers cannot hold: measure anyway
        # (`fleets_never_heard` says so) rather than lose the run.
        with contextlib.suppress(TimeoutError):
            wait(all_heard, 3 * args.interval_s + 120, "every fleet heartbeated once")
        # A fleet's first ticks are not idle (its engines' versions, its models' first health,
        # its golden baselines are recorded once): at 1,000 fleets that first pass takes minutes.
        # Measured after it, as a control plane restarted over existing fleets runs; how long it
        # took is `settle_s`.
        row["settle_s"] = settle(farm, actives, args, since)
        window = max(args.seconds, 3 * args.interval_s)
        cpu0, pg0, farm0 = group_cpu_s(crew.pgids()), pg.counters(), farm.stats()
        t0 = time.monotonic()
        conns: list[tuple[int, int]] = []
        while time.monotonic() - t0 < window:
            conns.append(pg.connections())
            time.sleep(1)
        t1 = time.monotonic()
        cpu1, farm1, heard = group_cpu_s(crew.pgids()), farm.stats(), farm.heartbeats()
        time.sleep(1.5)  # the backends report their counters within about a second
        pg1 = pg.counters()
        elapsed = t1 - t0
        late, silent = tick_lateness(heard, actives, t0=t0, t1=t1, interval_s=args.interval_s)
        ticks = sum(1 for n in actives for t in heard.get(n, ()) if t0 <= t <= t1)
        cpu = cpu1 - cpu0
        row.update(
            window_s=round(elapsed, 1),
            tick_lateness_p50_s=_round(percentile(late, 50)),
            tick_lateness_p90_s=_round(percentile(late, 90)),
            tick_lateness_p99_s=_round(percentile(late, 99)),
            fleets_never_heard=silent,
            # Heartbeats of each active per interval: 1.0 when every fleet is ticked once an
            # interval; above when workers tick a fleet again soon after another's tick.
            active_beats_per_interval=_ratio(ticks, fleets * elapsed / args.interval_s),
            cpu_s_per_fleet_minute=round(cpu / fleets / (elapsed / 60), 4),
            control_plane_cpu_pct=round(100 * cpu / elapsed, 1),
            rows_written_per_tick_per_fleet=_ratio(pg1["rows"] - pg0["rows"], ticks),
            transactions_per_tick_per_fleet=_ratio(pg1["commits"] - pg0["commits"], ticks),
            pg_connections_max=max(c[0] for c in conns),
            pg_connections_active_max=max(c[1] for c in conns),
            farm_rss_mib=farm1["rssMiB"],
            farm_cpu_pct=round(100 * (farm1["cpuS"] - farm0["cpuS"]) / elapsed, 1),
        )
        found = reads()
        row.update({k: found.get(k) for k in ("overview_ms", "fleet_list_ms", "metrics_ms")})
        if not args.no_failover:
            try:
                row.update(inject_failover(farm, crew.url, fleets))
            except TimeoutError as exc:
                # The figures stay None; what did not happen is said once, in the notes.
                row["notes"] = f"failover: {exc}"
        row.update(crew.kill_one())
    finally:
        crew.stop()
        farm.stop()
        connections.close_all()
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 2) if whole else None


def print_table(runs: list[dict[str, Any]]) -> None:
    head = ["", *(f"{r['fleets']}x{r['workers']}w" for r in runs)]
    width = max(len(f) for f in FIELDS) + 2
    print("".join([head[0].ljust(width), *(h.rjust(14) for h in head[1:])]))
    for field in FIELDS[:-1]:  # all but the notes, printed below
        cells = ["not measured" if r.get(field) is None else str(r[field]) for r in runs]
        print("".join([field.ljust(width), *(c.rjust(14) for c in cells)]))
    for run, name in zip(runs, head[1:], strict=True):
        if run.get("notes"):
            print(f"note ({name}): {run['notes']}")


PANELS = (
    ("control-plane CPU per fleet per minute (s)", ("cpu_s_per_fleet_minute",)),
    (
        "rows written and transactions per tick per fleet",
        ("rows_written_per_tick_per_fleet", "transactions_per_tick_per_fleet"),
    ),
    ("PostgreSQL connections", ("pg_connections_max", "pg_connections_active_max")),
    ("tick lateness (s)", ("tick_lateness_p50_s", "tick_lateness_p99_s")),
    ("failover (s)", ("failover_detection_s", "failover_overhead_s")),
    ("reads (ms)", ("metrics_ms", "overview_ms", "fleet_list_ms")),
)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """One panel per figure, x the number of fleets (log), a line per worker count."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: only --plot needs it
    except ImportError:
        raise SystemExit(
            "bench/scale.py: --plot needs matplotlib, which is not installed here; run with "
            "--json, then `--from-json FILE --plot PATH` where matplotlib is installed"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the backend

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for workers in sorted({r["workers"] for r in runs}):
            mine = sorted((r for r in runs if r["workers"] == workers), key=lambda r: r["fleets"])
            for key in keys:
                points = [(r["fleets"], r[key]) for r in mine if r.get(key) is not None]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o", label=f"{key} ({workers} worker(s))")
        ax.set_xscale("log")
        ax.set_xlabel("fleets")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("Haru at scale (bench/scale.py): one control plane over the fleet farm")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10,100,1000", help="fleets per run, comma-separated")
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    p.add_argument("--interval-s", type=float, default=5.0, help="reconcile interval")
    p.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    p.add_argument(
        "--settle-s",
        type=float,
        default=300.0,
        help="longest wait for every fleet to be heartbeated on time before measuring",
    )
    p.add_argument("--database-url", default=os.environ.get("SCALE_DATABASE_URL", DEFAULT_DB))
    p.add_argument("--redis-url", default=os.environ.get("SCALE_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--no-failover", action="store_true", help="skip the injected failover")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("--plot", type=Path, help="write a PNG of the per-size curves")
    p.add_argument("--from-json", type=Path, help="print and plot a saved --json line")
    args = p.parse_args(argv)
    if args.from_json is not None:
        runs = json.loads(args.from_json.read_text().strip().splitlines()[-1])["runs"]
    else:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        counts = [int(w) for w in args.workers.split(",") if w]
        if not sizes or min(sizes) < 1 or not counts or min(counts) < 1:
            p.error("--sizes and --workers take positive integers")
        if "haru_scale" not in args.database_url.rsplit("/", 1)[1]:
            p.error(
                "--database-url names the database this benchmark drops: its name must "
                "contain haru_scale"
            )
        setup_django(
            args.database_url, args.redis_url, Path(tempfile.mkdtemp(prefix="haru-scale-"))
        )
        pg = Postgres(args.database_url)
        runs = []
        try:
            for fleets in sizes:
                for workers in counts:
                    print(f"run: {fleets} fleets, {workers} worker(s)", file=sys.stderr, flush=True)
                    try:
                        row = run_one(args, fleets, workers, pg)
                    except NotReady as exc:
                        # A planned port taken by another process before the farm bound it
                        # (the ports are free when planned, not reserved): plan and seed anew.
                        print(f"run failed ({exc}); once more", file=sys.stderr, flush=True)
                        row = run_one(args, fleets, workers, pg)
                    # Each run as it ends, so a later failure loses no figure.
                    print(f"run done: {json.dumps(row)}", file=sys.stderr, flush=True)
                    runs.append(row)
        finally:
            pg.close()
    print_table(runs)
    if args.plot is not None:
        plot(runs, args.plot)
    if args.json:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(json.dumps({"date": stamp, "argv": sys.argv[1:], "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
