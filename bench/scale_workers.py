"""Work shared across machines: N reconcile workers as separate hosts, one killed under load.

    .venv/bin/python bench/scale_workers.py --database-url postgres://... [--workers 2]
        [--interval-ms 1000] [--lease-ms 4000] [--settle-s 5] [--json]

Against a database whose fleets are already seeded (bench/scale.py's farm, or the integration
test's two simulated hosts), starts N workers, each the `manage.py reconcile --loop` the docs
ship, each in its own UTS and PID namespace (`unshare --uts --pid --fork --mount-proc`, as root)
with its own host name and var directory, so the lease code (fleets/reconciler/locks.py) sees N
different hosts. Without namespaces (not root, no `unshare`) each worker gets a distinct host
identity instead, and says so. No network namespace: the workers must reach the database and
the simulated supervisors on 127.0.0.1, which a new network namespace would hide (a veth pair
per worker would be needed); the lease code names holders by host and PID namespace only.

Every worker records each tick it runs, from inside the fleet's lease (the start and the end
of `fleet_tick`), to a file of its own: a bench-only wrapper installed in the worker process,
nothing written to the database. After `--settle-s` the bench kills one worker with SIGKILL
while it has a tick in flight, waits, stops the others and reads the records:

- `double_ticks`: pairs of ticks of one fleet that overlap in time (a killed worker's last tick
  counts as running until the kill). Must be 0.
- `handover_s`: from the kill until every fleet the killed worker ticked last was ticked again
  by another worker. Must be within one lease (`lease_s`) plus the skipped tick's retry slack.
- `survivor_lateness_max_s`: the latest any periodic tick of the surviving workers started (its
  start less the fleet's previous tick's end and one interval): on a loaded machine a handed-over
  fleet waits that long too, beyond its lease.
- `inflight_wait_s`: for the fleets it held at the kill, from that tick's start to the next
  tick: at least one lease less the time before that start, since a dead holder on another
  host is waited out, not taken over at once.

bench/scale.py imports `workers_run` (interface 2 of issue 27).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from haru.local.processes import kill_group, log_tail, spawn, wait_for  # noqa: E402

# What a handover may take beyond one lease: the skipped tick looks again 50 ms after the
# holder's deadline (fleets/reconciler/tick.py LEASE_RETRY_SLACK_MS), then the survivor's loop
# must start it (measured up to 0.36 s later with eight engineers' jobs on two cores).
HANDOVER_SLACK_S = 1.0
# What the workers' environment must not inherit: each worker is its own host.
_DROP = ("HARU_VAR_DIR", "PROMETHEUS_MULTIPROC_DIR", "HARU_PROMETHEUS_MULTIPROC_DIR", "REDIS_URL")
_HOST_ID_ENV = "HARU_BENCH_HOST_ID"


def namespaces_available() -> bool:
    """Whether workers can run in UTS and PID namespaces of their own here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Worker:
    """One worker process (in namespaces of its own where available)."""

    name: str
    proc: subprocess.Popen
    record: Path
    log: Path
    namespaced: bool
    killed_at: float | None = None

    def host(self) -> str:
        """The lease holder prefix this worker announced (host:pid-namespace), once started."""
        for line in _lines(self.record):
            if line.startswith("host "):
                return line.split(" ", 1)[1]
        return ""

    def in_flight(self) -> set[str]:
        """Fleets whose tick this worker has started and not finished."""
        open_: set[str] = set()
        for line in _lines(self.record):
            kind, _, rest = line.partition(" ")
            fleet = rest.split(" ", 1)[0]
            if kind == "start":
                open_.add(fleet)
            elif kind == "end":
                open_.discard(fleet)
        return open_

    def kill(self) -> float:
        """SIGKILL the worker (its whole namespace); return the moment, on the records' clock."""
        self.killed_at = time.time()
        kill_group(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        with self.record.open("a") as out:  # the records stay readable on their own
            out.write(f"killed {self.killed_at:.6f}\n")
        return self.killed_at

    def stop(self) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def start_workers(
    count: int,
    *,
    database_url: str,
    workdir: Path,
    interval_ms: int,
    lease_ms: int,
    env: Mapping[str, str] | None = None,
    namespaces: bool | None = None,
) -> list[Worker]:
    """Start `count` reconcile workers against `database_url`, each a host of its own."""
    use_ns = namespaces_available() if namespaces is None else namespaces
    base = {k: v for k, v in (env or os.environ).items() if not k.startswith(_DROP)}
    workers = []
    for n in range(1, count + 1):
        name = f"haru-worker-{n}"
        record = workdir / f"{name}.ticks"
        log = workdir / f"{name}.log"
        child_env = {
            **base,
            "DATABASE_URL": database_url,
            "HARU_RECONCILE_INTERVAL_MS": str(interval_ms),
            "HARU_TICK_LEASE_MS": str(lease_ms),
            "HARU_VAR_DIR": str(workdir / name / "var"),  # its own metrics directory
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "bench.scale_workers", "worker", "--record", str(record)]
        if use_ns:
            # The namespace's first process sets its host name, then becomes the worker.
            script = 'hostname "$1" && shift && exec "$@"'
            argv = [
                "unshare", "--uts", "--pid", "--fork", "--mount-proc",
                "sh", "-c", script, "sh", name, *argv,
            ]  # fmt: skip
        else:
            child_env[_HOST_ID_ENV] = f"{name}:bench"
        workers.append(Worker(name, spawn(argv, env=child_env, log=log), record, log, use_ns))
    for worker in workers:
        wait_for(
            lambda w=worker: bool(w.host()),
            60,
            f"{worker.name} started",
            gave_up=lambda w=worker: None if w.proc.poll() is None else log_tail(w.log),
        )
    return workers


@dataclass(frozen=True)
class Tick:
    fleet: str
    worker: str
    start: float
    end: float
    cut: bool = False  # the worker was killed while it ran


def ticks_read(workers: Iterable[Worker]) -> list[Tick]:
    """Every recorded tick; one a killed worker did not finish ends at its kill."""
    out = []
    for worker in workers:
        started: dict[str, float] = {}
        for line in _lines(worker.record):
            kind, _, rest = line.partition(" ")
            if kind not in ("start", "end"):
                continue
            fleet, _, stamp = rest.partition(" ")
            if kind == "start":
                started[fleet] = float(stamp)
            elif fleet in started:
                out.append(Tick(fleet, worker.name, started.pop(fleet), float(stamp)))
        end = worker.killed_at if worker.killed_at is not None else time.time()
        out.extend(
            Tick(fleet, worker.name, begun, end, cut=True) for fleet, begun in started.items()
        )
    return out


def double_ticks_count(ticks: Iterable[Tick]) -> int:
    """Pairs of ticks of one fleet that overlap in time."""
    by_fleet: dict[str, list[Tick]] = defaultdict(list)
    for tick in ticks:
        by_fleet[tick.fleet].append(tick)
    pairs = 0
    for runs in by_fleet.values():
        runs.sort(key=lambda t: t.start)
        for i, tick in enumerate(runs):
            for later in runs[i + 1 :]:
                if later.start >= tick.end:
                    break
                pairs += 1
    return pairs


def lateness_s(ticks: Iterable[Tick], interval_s: float, *, skip: str = "") -> list[float]:
    """How late each periodic tick started: its start less (the fleet's previous tick's end plus
    one interval), for consecutive ticks of one fleet both run by workers other than `skip`.
    What every fleet waited on this machine at that load, handed over or not."""
    by_fleet: dict[str, list[Tick]] = defaultdict(list)
    for tick in ticks:
        by_fleet[tick.fleet].append(tick)
    out = []
    for runs in by_fleet.values():
        runs.sort(key=lambda t: t.start)
        out.extend(
            max(0.0, b.start - a.end - interval_s)
            for a, b in zip(runs, runs[1:], strict=False)
            if skip not in (a.worker, b.worker) and not a.cut
        )
    return out


@dataclass
class Handover:
    handover_s: float | None = None  # None: some fleet was not ticked again
    fleets: int = 0  # the killed worker's fleets (those it ticked last)
    inflight: int = 0  # held at the kill
    inflight_wait_s: list[float] = field(default_factory=list)  # that tick's start -> next


def handover_measure(ticks: list[Tick], killed: Worker) -> Handover:
    """From the kill until every fleet the killed worker ticked last was ticked again."""
    assert killed.killed_at is not None
    kill = killed.killed_at
    last: dict[str, Tick] = {}
    for tick in sorted(ticks, key=lambda t: t.start):
        if tick.start <= kill:
            last[tick.fleet] = tick
    theirs = [t for t in last.values() if t.worker == killed.name]
    result = Handover(fleets=len(theirs), inflight=sum(t.cut for t in theirs))
    waits = []
    for mine in theirs:
        after = [t.start for t in ticks if t.fleet == mine.fleet and t.start > kill]
        if not after:
            return result
        waits.append(min(after) - kill)
        if mine.cut:
            result.inflight_wait_s.append(min(after) - mine.start)
    result.handover_s = max(waits, default=0.0)
    return result


def workers_run(
    *,
    database_url: str,
    workers: int = 2,
    interval_ms: int = 5000,
    lease_ms: int = 15000,
    settle_s: float = 10.0,
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """Run `workers` workers over the seeded fleets, kill one mid-tick, and measure.

    Returns `workers`, `namespaces`, `hosts`, `interval_s`, `lease_s`, `ticks`,
    `ticks_by_worker`, `double_ticks`,
    and with two or more workers `handover_s`, `handover_fleets`, `inflight_at_kill`,
    `inflight_wait_s` and `survivor_lateness_max_s` (see the module's docstring).
    """
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="haru-workers-")))
        started = start_workers(
            workers,
            database_url=database_url,
            workdir=workdir,
            interval_ms=interval_ms,
            lease_ms=lease_ms,
            env=env,
        )
        try:
            time.sleep(settle_s)
            victim = started[0] if workers > 1 else None
            if victim is not None:
                # Under load: wait (up to two intervals) for a tick in flight, so the survivor
                # must wait out a held lease, then kill.
                deadline = time.monotonic() + 2 * interval_ms / 1000
                while not victim.in_flight() and time.monotonic() < deadline:
                    time.sleep(0.005)
                victim.kill()
                # Until every fleet it ticked last is ticked again, or well past one lease (a
                # fleet still waiting then is reported as starved: handover_s None).
                cap = time.monotonic() + lease_ms / 1000 + 4 * interval_ms / 1000
                while time.monotonic() < cap:
                    time.sleep(0.1)
                    if handover_measure(ticks_read(started), victim).handover_s is not None:
                        break
        finally:
            for worker in started:
                worker.stop()
        ticks = ticks_read(started)
        out: dict = {
            "workers": workers,
            "namespaces": started[0].namespaced,
            "hosts": sorted({w.host() for w in started}),
            "interval_s": interval_ms / 1000,
            "lease_s": lease_ms / 1000,
            "ticks": len(ticks),
            "ticks_by_worker": {w.name: sum(t.worker == w.name for t in ticks) for w in started},
            "double_ticks": double_ticks_count(ticks),
        }
        if victim is not None:
            handover = handover_measure(ticks, victim)
            late = sorted(lateness_s(ticks, interval_ms / 1000, skip=victim.name))
            out.update(
                # The survivors' own ticks: how late any fleet was ticked at this load.
                survivor_lateness_max_s=round(late[-1], 3) if late else None,
                handover_s=handover.handover_s,
                handover_fleets=handover.fleets,
                inflight_at_kill=handover.inflight,
                inflight_wait_s=[round(s, 3) for s in handover.inflight_wait_s],
            )
        return out


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


# -- inside a worker ---------------------------------------------------------------------------


def _worker_main(record: Path) -> None:
    """Be one worker: `manage.py reconcile --loop`, recording each tick from inside its lease."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415 - only the worker needs Django

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    from fleets.reconciler import locks, loop, tick  # noqa: PLC0415

    if os.environ.get(_HOST_ID_ENV):
        # No namespaces here: a distinct host identity, so a killed worker's lease is waited
        # out as another machine's would be (the bench's stand-in for a second host).
        locks._HOST = os.environ[_HOST_ID_ENV]  # noqa: SLF001
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(line: str) -> None:
        os.write(fd, f"{line}\n".encode())  # one append per line: whole lines from any thread

    write(f"host {locks._HOST}")  # noqa: SLF001
    real = tick.fleet_tick

    def recorded(*, fleet_id, **kwargs):
        # Called by tick_run with the fleet's lease held: start and end lie inside the lease.
        write(f"start {fleet_id} {time.time():.6f}")
        try:
            return real(fleet_id=fleet_id, **kwargs)
        finally:
            write(f"end {fleet_id} {time.time():.6f}")

    tick.fleet_tick = recorded
    run = loop.tick_run

    def run_recorded(*, fleet_id, **kwargs):
        # A skipped tick (another worker holds the lease): when, and when it will look again.
        result = run(fleet_id=fleet_id, **kwargs)
        if not result.ran:
            write(f"skip {fleet_id} {time.time():.6f} {result.nudge_ms}")
        return result

    loop.tick_run = run_recorded
    call_command("reconcile", "--loop")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("worker", help="(internal) be one worker")
    inner.add_argument("--record", type=Path, required=True)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--lease-ms", type=int, default=15000)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.command == "worker":
        _worker_main(args.record)
        return
    if not args.database_url:
        parser.error("--database-url (or DATABASE_URL) is needed: the workers share it")
    result = workers_run(
        database_url=args.database_url,
        workers=args.workers,
        interval_ms=args.interval_ms,
        lease_ms=args.lease_ms,
        settle_s=args.settle_s,
    )
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>18}: {value}")


if __name__ == "__main__":
    main()
