"""A flapping active and a partitioned or slow supervisor, under chat load: failovers and failed
requests (issue 29's targets).

    .venv/bin/python bench/flap_partition.py [--kinds flap-host,flap-supervisor,partition,slow]
                                             [--flap-every-s 10] [--flap-for-s 120]
                                             [--partition-s 60] [--no-damping] [--quick] [--json]

Each kind gets a fresh stack like `make demo`: two simulated hosts (supervisor + two sim engines
+ sim trainer each) and `manage.py serve` (chat proxy + the in-process reconcile loop, embedded
SQLite); for the partition and the slow supervisor, east's supervisor is reached through a relay
that can be cut (haru/local/relay.py), the model servers directly, as the proxy reaches them.
Eight client loops (half streaming) call the proxy with the OpenAI SDK (`max_retries=0`) the
whole time. Kinds:

- flap-host: every `--flap-every-s`, for `--flap-for-s`, the active's whole host (supervisor and
  model servers, whichever domain is active then) is SIGKILLed and restarted at once; engines
  come back awake. Requests in flight at a kill cannot be answered (the proxy never replays a
  request a dead server may have started): they are counted apart.
- flap-supervisor: the same with only the active's supervisor SIGKILLed and restarted (it
  adopts the engines still serving).
- partition: the control plane cut off from the active's supervisor for `--partition-s` while
  its model servers serve.
- slow: the active's supervisor answers `--slow-answer-s` later than asked (past the heartbeat's
  deadline) for `--partition-s`.

The targets: a flapping active at most 2 failovers, 0 failed requests; a partition 0 failovers,
0 failed requests. `--no-damping` sets flapMaxFailovers 0 (damping off) to show what it
prevents. The policy is the launcher's fast one with the two-domain example's windows
(heartbeatStaleMs 3 s, degradedGraceMs 5 s) and the flap damping defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.failover_load import CLIENTS, Clients, Req  # noqa: E402
from fleets.core.policy import DEFAULTS  # noqa: E402
from haru.local.layouts import FAST_POLICY, fleet_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
from haru.local.relay import CutRelay  # noqa: E402
from haru.local.server import ServerProc  # noqa: E402
from haru.local.supervisors import SimHost, put_in_standby_posture  # noqa: E402

KINDS = ("flap-host", "flap-supervisor", "partition", "slow")
POLICY = {**FAST_POLICY, "heartbeatStaleMs": 3000, "degradedGraceMs": 5000}


class Stack:
    """Two simulated hosts and `manage.py serve`; east's supervisor behind a cuttable relay."""

    def __init__(self, workdir: Path, *, relay: bool) -> None:
        """`relay`: east's supervisor behind the relay. Not for the flaps: a relay accepts the
        connection a dead supervisor would refuse, and the refusal is the evidence that fails
        a dead host at once (fleets.reconciler.datapath)."""
        self.workdir = workdir
        self.hosts = {
            name: SimHost(name, workdir, start_asleep=name == "west") for name in ("east", "west")
        }
        self.relay = CutRelay(self.hosts["east"].port) if relay else None
        self.server = ServerProc(workdir, env={"HARU_RECONCILE_INTERVAL_MS": "500"})

    def start(self, policy: dict[str, Any]) -> Stack:
        for host in self.hosts.values():
            host.start()
        put_in_standby_posture(self.hosts["west"])
        self.hosts["west"].boot_awake()  # restarted as the active, it comes back serving
        layout = fleet_layout(self.hosts["east"], self.hosts["west"], policy)
        if self.relay is not None:
            layout["domains"][0]["supervisorUrl"] = self.relay.start().url
        path = self.workdir / "layout.json"
        path.write_text(json.dumps(layout))
        self.server.manage("migrate", "--noinput", "-v0")
        self.server.manage("seed_layout", "--config", str(path))
        self.server.start()
        wait_for(self.seen, 30, "both domains heartbeated")
        return self

    def stop(self) -> None:
        self.server.kill(signal.SIGTERM)
        if self.relay is not None:
            self.relay.stop()
        for host in self.hosts.values():
            host.crash()

    def fleet(self) -> dict[str, Any]:
        response = self.server.api("GET", "/fleets/e2e")
        response.raise_for_status()
        return response.json()

    def seen(self) -> bool:
        return all(d.get("lastSeenAt") for d in self.fleet()["domains"])

    def active(self) -> str:
        fleet = self.fleet()
        return next(d["slug"] for d in fleet["domains"] if d["id"] == fleet["activeDomainId"])

    def state(self, slug: str) -> str:
        return next(d["state"] for d in self.fleet()["domains"] if d["slug"] == slug)

    def operations(self) -> list[dict[str, Any]]:
        response = self.server.api("GET", "/fleets/e2e/operations?limit=200")
        response.raise_for_status()
        body = response.json()
        return body["operations"] if isinstance(body, dict) else body


def flap(stack: Stack, args: argparse.Namespace, host_too: bool) -> list[tuple[float, float]]:
    """Kill and restart the active every `flap_every_s` for `flap_for_s`; return each kill's
    (start, end) in time.time()."""
    kills = []
    started = time.time()
    while time.time() - started < args.flap_for_s:
        host = stack.hosts[stack.active()]
        at = time.time()
        if host_too:
            host.crash()
        else:
            assert host.proc is not None
            os.kill(host.proc.pid, signal.SIGKILL)  # the supervisor only: its engines serve on
            host.proc.wait(10)
        kills.append((at, time.time()))
        host.start()
        time.sleep(max(0.0, at + args.flap_every_s - time.time()))
    return kills


def cut_off(stack: Stack, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """Cut (or slow) east's supervisor for `partition_s`; return what the fleet said meanwhile."""
    relay = stack.relay
    assert relay is not None
    if kind == "partition":
        relay.cut()
    else:
        relay.slow(args.slow_answer_s)
    at = time.time()
    states = set()
    while time.time() - at < args.partition_s:
        states.add(stack.state("east"))
        time.sleep(0.5)
    relay.heal()
    healed = time.time()
    wait_for(lambda: stack.state("east") == "ready", 60, "east ready again")
    return {"seconds": round(healed - at, 1), "eastStates": sorted(states),
            "readyAfterHealS": round(time.time() - healed, 2)}  # fmt: skip


def run_kind(kind: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    policy = {**POLICY, **({"flapMaxFailovers": 0} if args.no_damping else {})}
    stack = Stack(workdir / kind, relay=not kind.startswith("flap"))
    clients = None
    try:
        stack.start(policy)
        clients = Clients(f"{stack.server.url}/v1", stack.server.api_token, "e2e").start()
        time.sleep(2.0)  # warm: every client has a connection and a snapshot
        start = time.time()
        kills: list[tuple[float, float]] = []
        extra: dict[str, Any] = {}
        if kind.startswith("flap"):
            kills = flap(stack, args, host_too=kind == "flap-host")
        else:
            extra = cut_off(stack, args, kind)
        end = time.time()
        wait_for(lambda: not _in_flight(stack), 120, "nothing in flight")
        time.sleep(3.0)  # the last host back serves again before the load stops
        clients.stop()
        ops = stack.operations()
        stop_at = time.time()
    finally:
        if clients is not None:
            clients.stop()
        stack.stop()
    reqs = clients.since(start - 1.0, stop_at)
    return _row(kind, policy, start, end, kills, ops, reqs, extra)


def _in_flight(stack: Stack) -> bool:
    return any(o["state"] in ("pending", "running") for o in stack.operations())


def _row(
    kind: str,
    policy: dict[str, Any],
    start: float,
    end: float,
    kills: list[tuple[float, float]],
    ops: list[dict[str, Any]],
    reqs: list[Req],
    extra: dict[str, Any],
) -> dict[str, Any]:
    failovers = [o for o in ops if o["kind"] == "promote" and o["reason"] == "auto_failover"]
    failed = [r for r in reqs if not r.ok]
    at_kill = [r for r in failed if any(r.started < done and r.ended > at for at, done in kills)]
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "kind": kind,
        "seconds": round(end - start, 1),
        "kills": len(kills),
        "failovers": len(failovers),
        "routingCommitted": sum(o["routingCommitted"] for o in failovers),
        "demotions": sum(o["kind"] == "demote" for o in ops),
        "requests": len(reqs),
        "failedRequests": len(failed),
        "failedInFlightAtAKill": len(at_kill),
        "failedOtherwise": len(failed) - len(at_kill),
        "errors": errors,
        "flapMaxFailovers": policy.get("flapMaxFailovers", 2),
        **extra,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--flap-every-s", type=float, default=10.0)
    parser.add_argument("--flap-for-s", type=float, default=120.0)
    parser.add_argument("--partition-s", type=float, default=60.0)
    parser.add_argument("--slow-answer-s", type=float, default=3.0)
    parser.add_argument("--no-damping", action="store_true", help="flapMaxFailovers 0")
    parser.add_argument("--quick", action="store_true", help="flap 5 s for 30 s, cut 15 s")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    if args.quick:
        args.flap_every_s, args.flap_for_s, args.partition_s = 5.0, 30.0, 15.0
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(KINDS):
        parser.error(f"unknown kind(s): {', '.join(sorted(set(kinds) - set(KINDS)))}")
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)  # the stack's own embedded store and loop
    for name in ("httpx", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-flap-partition-"))
    rows = []
    for kind in kinds:
        row = run_kind(kind, args, workdir)
        rows.append(row)
        if not args.json:
            print(_line(row), flush=True)
    if args.json:
        flap = {k: v for k, v in DEFAULTS.items() if k.startswith("flap")}
        print(json.dumps({"clients": CLIENTS, "policy": POLICY, "flapDefaults": flap,
                          "args": vars(args), "results": rows}, indent=1))  # fmt: skip
    return 0


def _line(row: dict[str, Any]) -> str:
    what = f"{row['kills']} kills in {row['seconds']} s" if row["kills"] else f"{row['seconds']} s"
    return (
        f"{row['kind']:<16} {what}: failovers {row['failovers']}, failed requests "
        f"{row['failedRequests']}/{row['requests']} ({row['failedInFlightAtAKill']} in flight at "
        f"a kill, {row['failedOtherwise']} otherwise) {row['errors'] or ''}"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
