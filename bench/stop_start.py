"""How many operations stopping the control plane together with its hosts starts (issue 28).

    .venv/bin/python bench/stop_start.py [-n 10] [--signal TERM|INT|both] [--workers 1] [--json]
    .venv/bin/python bench/stop_start.py --demo [-n 10] [--json]

Two simulated hosts (supervisor + two sim engines + sim trainer each) and `manage.py serve`
with its reconcile loop every 200 ms, all real processes from haru/local/, on a fresh embedded
store. Each round sends the server and both supervisors one signal each at the same moment (what
`make demo`'s Ctrl-C does: the demo SIGTERMs all three; `INT` is a terminal's Ctrl-C reaching
them directly), waits for them to exit, starts the hosts and then the server again, lets it tick
for a while and counts the fleet's operations. The target is 0: a stopping control plane starts
no failover, and a restart finds nothing left behind.

`--demo` runs `make demo` itself (`python -m haru.demo`, on its fixed ports, with a var dir of
its own) and presses Ctrl-C: SIGINT to the demo's process group, once it has printed its
instructions and a few seconds of events; the demo then SIGTERMs its server and both
supervisors at once. It counts the operations the control plane started from the Ctrl-C until
the demo had exited. Operations started while the demo starts are reported apart: each start
finds the standby's models awake (the simulated engines start awake) and puts it back in standby
posture, by the demo's own demotion or the reconciler's `restore_standby`, whichever asks first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from haru.local import PYTHON, REPO  # noqa: E402
from haru.local.layouts import fleet_layout  # noqa: E402
from haru.local.processes import kill_group, wait_for  # noqa: E402
from haru.local.server import ServerProc  # noqa: E402
from haru.local.stop_start import stop_start_round  # noqa: E402
from haru.local.supervisors import SimHost, put_in_standby_posture  # noqa: E402

SIGNALS = {
    "TERM": [signal.SIGTERM],
    "INT": [signal.SIGINT],
    "both": [signal.SIGTERM, signal.SIGINT],
}


def operations(server: ServerProc, slug: str) -> list[dict]:
    response = server.api("GET", f"/fleets/{slug}/operations")
    response.raise_for_status()
    return response.json()["operations"]


# The demo prints this once the fleet is up; its events follow.
DEMO_UP = "The fleet's events follow"
# How long the demo runs (printing events) before Ctrl-C.
DEMO_RUN_S = 3.0


def demo_rounds(n: int, *, quiet: bool) -> list[dict]:
    """Start the real demo `n` times in a row (one database throughout) and Ctrl-C it each
    time; count the operations created from each Ctrl-C until the demo exited, and apart from
    them those created while it started."""
    var = Path(tempfile.mkdtemp(prefix="haru-bench-demo-"))
    env = {**os.environ, "HARU_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1"}
    rounds: list[dict] = []
    by_stops = by_starts = 0
    for i in range(n):
        log = var / f"demo-{i + 1}.log"
        launched_at = _utc()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [PYTHON, "-m", "haru.demo", *(["--fresh"] if i == 0 else [])],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(lambda p=log: DEMO_UP in p.read_text(errors="replace"), 120, "the demo up")
            time.sleep(DEMO_RUN_S)
            started, signalled_at = time.monotonic(), _utc()
            kill_group(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
            proc.wait(60)
            stop_s, exited_at = time.monotonic() - started, _utc()
        finally:
            if proc.poll() is None:
                kill_group(proc.pid)
            subprocess.run(
                [PYTHON, "-m", "haru.demo", "stop"],
                cwd=REPO,
                env=env,
                check=False,
                capture_output=True,
            )
        during_stop = _reasons(var, signalled_at, exited_at)
        by_stops += len(during_stop)
        by_starts += len(_reasons(var, launched_at, signalled_at))
        rounds.append(
            {
                "round": i + 1,
                "signal": "SIGINT (Ctrl-C of the demo)",
                "stopS": round(stop_s, 3),
                "operations": by_stops,
                "reasons": sorted(set(during_stop)),
                "operationsWhileStarting": by_starts,
            }
        )
        if not quiet:
            print(
                f"round {i + 1}/{n}: Ctrl-C, the demo stopped in {stop_s:.1f} s; operations "
                f"started by the stops so far: {by_stops} (while starting: {by_starts})",
                flush=True,
            )
    return rounds


def _reasons(var: Path, since: str, until: str) -> list[str]:
    """The reasons of the operations created in [since, until] in the demo's store."""
    with sqlite3.connect(var / "haru.sqlite3") as db:
        rows = db.execute(
            "SELECT reason FROM fleets_operation WHERE created_at >= ? AND created_at <= ?",
            (since, until),
        ).fetchall()
    return [reason for (reason,) in rows]


def _utc() -> str:
    """Now, spelt as the embedded store keeps a timestamp (UTC, microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10, help="stop-and-start rounds in a row")
    parser.add_argument(
        "--signal",
        choices=sorted(SIGNALS),
        default="both",
        help="the signal sent each round (both: alternate, TERM first)",
    )
    parser.add_argument("--workers", type=int, default=1, help="serve --workers")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--demo", action="store_true", help="Ctrl-C the real demo instead")
    args = parser.parse_args()
    if args.demo:
        rounds = demo_rounds(args.n, quiet=args.json)
        started = rounds[-1]["operations"] if rounds else 0
        if args.json:
            print(
                json.dumps(
                    {
                        "rounds": len(rounds),
                        "signal": "demo Ctrl-C",
                        "operationsStarted": started,
                        "perRound": rounds,
                    },
                    indent=1,
                )
            )
        else:
            print(
                f"FIGURE stop-start: {len(rounds)} Ctrl-C of the demo: {started} operation(s) "
                "started by the control plane"
            )
        return 0 if started == 0 else 1

    workdir = Path(tempfile.mkdtemp(prefix="haru-bench-stop-"))
    east = SimHost("east", workdir)
    west = SimHost("west", workdir, start_asleep=True)
    server = ServerProc(workdir, env={})
    server.env.pop("DATABASE_URL", None)  # a store of its own: the embedded SQLite
    serve_args = ["--workers", str(args.workers)] if args.workers > 1 else []
    slug = "e2e"
    rounds: list[dict] = []
    try:
        east.start()
        west.start()
        put_in_standby_posture(west)
        layout = workdir / "layout.json"
        # Nothing the restart itself would start: a returned standby stays as it is.
        layout.write_text(json.dumps(fleet_layout(east, west, {"restoreStandbyOnReturn": False})))
        server.manage("migrate", "--noinput", "-v0")
        server.manage("seed_layout", "--config", str(layout))
        server.start(*serve_args)
        wait_for(
            lambda: all(
                d["lastSeenAt"] for d in server.api("GET", f"/fleets/{slug}").json()["domains"]
            ),
            15,
            "heartbeats",
        )
        sigs = SIGNALS[args.signal]
        for i in range(args.n):
            sig = sigs[i % len(sigs)]
            result = stop_start_round(
                server, (east, west), sig=sig, fleet=slug, serve_args=serve_args
            )
            ops = operations(server, slug)
            rounds.append(
                {
                    "round": i + 1,
                    "signal": result.signal,
                    "serverOutlivedHostsS": result.server_outlived_hosts_s,
                    "stopS": result.stop_s,
                    "operations": len(ops),
                    "reasons": sorted({o["reason"] or "" for o in ops}),
                }
            )
            if not args.json:
                print(
                    f"round {i + 1}/{args.n}: {result.signal}, the server outlived both hosts by "
                    f"{result.server_outlived_hosts_s:.2f} s; operations now: {len(ops)}",
                    flush=True,
                )
    finally:
        server.kill()
        east.crash()
        west.crash()
    started = rounds[-1]["operations"] if rounds else 0
    summary = {
        "rounds": len(rounds),
        "signal": args.signal,
        "workers": args.workers,
        "operationsStarted": started,
        "hostsRefusedWhileServerStopping": sum(r["serverOutlivedHostsS"] > 0 for r in rounds),
        "perRound": rounds,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"FIGURE stop-start: {len(rounds)} stops of the server and both hosts at once "
            f"({args.signal}, serve --workers {args.workers}): {started} operation(s) started"
        )
    return 0 if started == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
