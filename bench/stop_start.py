"""How many operations stopping the control plane together with its hosts starts (issue 28).

    .venv/bin/python bench/stop_start.py [-n 10] [--signal TERM|INT|both] [--workers 1] [--json]

Two simulated hosts (supervisor + two sim engines + sim trainer each) and `manage.py serve`
with its reconcile loop every 200 ms, all real processes from haru/local/, on a fresh embedded
store. Each round sends the server and both supervisors one signal each at the same moment (what
`make demo`'s Ctrl-C does: the demo SIGTERMs all three; `INT` is a terminal's Ctrl-C reaching
them directly), waits for them to exit, starts the hosts and then the server again, lets it tick
for a while and counts the fleet's operations. The target is 0: a stopping control plane starts
no failover, and a restart finds nothing left behind.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from haru.local.layouts import fleet_layout  # noqa: E402
from haru.local.processes import wait_for  # noqa: E402
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
    args = parser.parse_args()

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
