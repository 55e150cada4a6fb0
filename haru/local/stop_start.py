"""Stop a local Haru's server and its hosts at the same moment, then start them again.

What `make demo`'s Ctrl-C does (the demo SIGTERMs the server and both supervisors in one go),
and what an outage that takes the control plane and the hosts down together looks like to the
next start. The end-to-end test and `bench/stop_start.py` run rounds of it and count the
operations the fleet has afterwards: a stopping control plane must start none (issue 28).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from .processes import kill_group, wait_for
from .server import ServerProc
from .supervisors import SimHost, put_in_standby_posture

# How long the restarted server ticks (every 200 ms) before the round is judged: an operation
# left behind, or one its first ticks would start, shows within it.
SETTLE_S = 2.0


@dataclass(frozen=True)
class Round:
    """One stop and start: the signal sent, how long the server outlived the hosts (it drains
    while its reconcile loop would still tick: the window the finding lived in) and how long the
    stop took."""

    signal: str
    server_outlived_hosts_s: float
    stop_s: float

    @property
    def hosts_refused(self) -> bool:
        """Whether the stopping server was still running once both hosts refused connections."""
        return self.server_outlived_hosts_s > 0


def _exited_at(proc: subprocess.Popen, timeout: float) -> float:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    return time.monotonic()


def stop_start_round(
    server: ServerProc,
    hosts: Sequence[SimHost],
    *,
    sig: int = signal.SIGTERM,
    fleet: str = "e2e",
    serve_args: Sequence[str] = (),
) -> Round:
    """Signal the server and every host's supervisor at once, wait for them, start them again.

    The first host is the active (restarted serving); the others are standbys, put back in
    standby posture directly (models asleep, trainer running) before the server starts, so the
    restarted server finds the fleet as it was.
    """
    assert server.proc is not None
    procs = [h.proc for h in hosts]
    assert all(p is not None for p in procs)
    started = time.monotonic()
    for pid in [server.proc.pid, *(p.pid for p in procs if p is not None)]:
        kill_group(pid, sig)
    hosts_down = max(_exited_at(p, 15) for p in procs if p is not None)
    server_down = _exited_at(server.proc, 30)
    stopped = time.monotonic() - started
    server.kill()  # whatever is left of the server's group
    for host in hosts:
        host.restart()
    for host in hosts[1:]:
        put_in_standby_posture(host)
    server.start(*serve_args)
    since = time.time()
    wait_for(lambda: _beaten_since(server, fleet, since), 15, "heartbeats of the restarted server")
    time.sleep(SETTLE_S)
    return Round(signal.Signals(sig).name, round(server_down - hosts_down, 3), round(stopped, 3))


def _beaten_since(server: ServerProc, fleet: str, since: float) -> bool:
    """Whether every domain's supervisor answered a heartbeat of the restarted server."""
    body = server.api("GET", f"/fleets/{fleet}").json()
    seen = [d.get("lastSeenAt") for d in body["domains"]]
    return all(
        s and datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() > since for s in seen
    )
