"""Stopping the control plane together with its hosts starts no operation (issue 28).

`make demo`'s Ctrl-C stopped the server and both supervisors at once: the server's reconcile
loop, still ticking while it drained, saw both hosts refuse connections, failed the active and
started a promotion that the next start resumed. Here the real server and two real simulated
hosts are stopped at the same moment (SIGTERM, and SIGINT as a terminal's Ctrl-C sends it),
restarted, and no operation may exist afterwards; several rounds in a row, as the finding
reproduced 3 times in 4.
"""

from __future__ import annotations

import signal

import pytest

from haru.local.stop_start import Round, stop_start_round
from tests.e2e.harness import ServerProc

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROUNDS = 3


def operations(server: ServerProc) -> list[dict]:
    response = server.api("GET", "/fleets/e2e/operations")
    response.raise_for_status()
    return response.json()["operations"]


@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGTERM, 2)],
    ids=["sigterm", "sigint", "sigterm-workers-2"],
)
def test_stopping_server_and_hosts_together_starts_no_operation(served, sig, workers):
    # With `serve --workers 2` the parent process ticks every fleet; it must stop ticking on
    # its own signal, not once its workers have drained.
    serve_args = ("--workers", str(workers)) if workers > 1 else ()
    east, west, server = served(policy={"restoreStandbyOnReturn": False}, serve_args=serve_args)
    rounds: list[Round] = []
    for _ in range(ROUNDS):
        rounds.append(stop_start_round(server, (east, west), sig=sig, serve_args=serve_args))
        ops = operations(server)
        assert ops == [], (rounds[-1], ops, server.output(80))
    assert all(r.hosts_refused for r in rounds), rounds
