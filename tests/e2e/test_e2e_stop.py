"""Stopping the control plane together with its hosts starts no operation (issue 28).

`make demo`'s Ctrl-C stopped the server and both supervisors at once: the server's reconcile
loop, still ticking while it drained, saw both hosts refuse connections, failed the active and
started a promotion that the next start resumed. Here the real server and two real simulated
hosts are stopped at the same moment (SIGTERM, and SIGINT as a terminal's Ctrl-C sends it),
restarted, and no operation may exist afterwards; several rounds in a row, as the finding
reproduced 3 times in 4.
"""

from __future__ import annotations

import json
import signal
import time
import uuid

import pytest

from haru.local.stop_start import Round, stop_start_round
from tests.e2e.harness import ServerProc, wait_for

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


def test_a_step_interrupted_by_a_crash_of_the_control_plane_is_not_charged_its_downtime(served):
    # The control plane dies (SIGKILL) while the promotion's trainer on west is saving its
    # checkpoint (6 s); the hosts run on, and the control plane comes back 12 s later, past the
    # step's 10 s budget. The step is recorded with the time it was driven, not the downtime.
    east, west, server = served(
        policy={"stopTrainingTimeoutMs": 10_000, "trainingStopGraceMs": 8_000},
        server_env={"HARU_TICK_LEASE_MS": "2000"},  # away after 2 s unheld
        west={"trainer_args": ("--sigterm-save-s", "6"), "grace_ms": 8_000},
    )
    domains = server.api("GET", "/fleets/e2e").json()["domains"]
    target = next(d["id"] for d in domains if d["slug"] == "west")
    accepted = server.api("POST", "/fleets/e2e/promote", {"targetDomainId": target})
    assert accepted.status_code == 202
    op_id = accepted.json()["operation"]["id"]
    wait_for(
        lambda: server.api("GET", f"/operations/{op_id}").json()["currentStep"] == "stop_training",
        15,
        "stop_training",
    )
    time.sleep(1.0)
    server.kill(signal.SIGKILL)
    time.sleep(12.0)
    server.start()

    op = wait_for(
        lambda: (o := server.api("GET", f"/operations/{op_id}").json())["state"] != "running" and o,
        30,
        "the resumed promotion",
    )
    assert op["state"] == "succeeded", op["error"]
    events = operation_events(server, op_id)
    stopped = next(
        e for e in events if e["kind"] == "operation.step.done" and e["step"] == "stop_training"
    )
    assert stopped["duration_ms"] < 5_000, stopped  # about 1 s driven; 13 s with the downtime
    resumed = [e for e in events if e["kind"] == "operation.resumed"]
    assert [e["step"] for e in resumed] == ["stop_training"]
    assert resumed[0]["data"]["awayMs"] >= 12_000


def operation_events(server: ServerProc, op_id: str) -> list[dict]:
    """The operation's events, read from the server's own store."""
    script = (
        "import json\n"
        "from fleets.models import Event\n"
        f"rows = Event.objects.filter(operation_id={str(uuid.UUID(op_id))!r}).order_by('id')\n"
        "print(json.dumps(list(rows.values('kind', 'step', 'duration_ms', 'data'))))\n"
    )
    out = server.manage("shell", "-c", script).stdout
    return json.loads(out.strip().splitlines()[-1])
