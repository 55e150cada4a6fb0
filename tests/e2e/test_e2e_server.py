"""End to end through the real server: `manage.py serve` runs the reconcile loop itself.

The server has its own database (a fresh SQLite file, or a fresh PostgreSQL database when the
suite runs on PostgreSQL), seeded with `manage.py seed_layout`; the test only talks HTTP.
"""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.e2e.harness import ServerProc, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def fleet(server: ServerProc) -> dict:
    response = server.api("GET", "/fleets/e2e")
    response.raise_for_status()
    return response.json()


def intent(server: ServerProc) -> dict:
    return server.api("GET", "/fleets/e2e/route-intent").json()


def operations(server: ServerProc) -> list[dict]:
    return server.api("GET", "/fleets/e2e/operations").json()["operations"]


def test_the_server_loop_fails_over_when_the_active_supervisor_dies(served):
    east, west, server = served(policy={"sleepTimeoutMs": 800})
    assert intent(server)["active"]["domainSlug"] == "east"

    east.crash()

    route = wait_for(
        lambda: (r := intent(server))["active"]["domainSlug"] == "west" and r, 25, "failover"
    )
    assert route["revision"] == 2 and route["active"]["eligible"]
    ops = wait_for(
        lambda: (o := operations(server)) and o[0]["state"] == "succeeded" and o, 15, "op"
    )
    assert ops[0]["reason"] == "auto_failover" and ops[0]["routingCommitted"]
    # The metrics of the failover are on /metrics of the same process.
    text = httpx.get(f"{server.url}/metrics", timeout=10, trust_env=False).text
    assert 'haru_domain_role{domain="west",fleet="e2e",role="active"} 1.0' in text
    assert "haru_failover_duration_seconds_count 1.0" in text


def test_a_server_killed_mid_step_leaves_nothing_that_blocks_the_next_one(served):
    east, west, server = served(policy={"wakeTimeoutMs": 30000})
    west.fault("qwen-small", wakeHangs=True)
    target = next(d["id"] for d in fleet(server)["domains"] if d["slug"] == "west")

    accepted = server.api("POST", "/fleets/e2e/promote", {"targetDomainId": target})
    assert accepted.status_code == 202
    op_id = accepted.json()["operation"]["id"]
    # Started at once on commit (no beat to wait for), then stuck in the hanging wake.
    wait_for(
        lambda: server.api("GET", f"/operations/{op_id}").json()["currentStep"] == "wake",
        15,
        "the wake step",
    )
    server.kill(signal.SIGKILL)  # the worker dies in the middle of the step
    west.fault("qwen-small", wakeHangs=False)
    server.start()

    op = wait_for(
        lambda: (o := server.api("GET", f"/operations/{op_id}").json())["state"] != "running" and o,
        25,
        "the resumed operation",
    )
    assert op["state"] == "succeeded", op["error"]
    assert intent(server)["active"]["domainSlug"] == "west"
    assert intent(server)["revision"] == 2
    assert [o["id"] for o in operations(server)] == [op_id]  # resumed, not re-created


def test_serve_with_several_workers_starts_a_promotion_in_the_worker_that_took_it(served):
    # A long interval: the parent's periodic loop would start the promotion a minute from now;
    # the worker that accepted it drives it at once (fleets/server/driver.py).
    east, west, server = served(
        serve_args=("--workers", "2"), server_env={"HARU_RECONCILE_INTERVAL_MS": "60000"}
    )
    target = next(d["id"] for d in fleet(server)["domains"] if d["slug"] == "west")
    accepted = server.api("POST", "/fleets/e2e/promote", {"targetDomainId": target})
    assert accepted.status_code == 202
    op_id = accepted.json()["operation"]["id"]
    op = wait_for(
        lambda: (
            (o := server.api("GET", f"/operations/{op_id}").json())["state"] == "succeeded" and o
        ),
        30,
        "the promotion driven by the serving worker",
    )
    assert op["routingCommitted"]
    assert intent(server)["revision"] == 2
