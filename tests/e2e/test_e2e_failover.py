"""End to end with real processes: two supervisors, four simulated engines, two simulated
trainers; ticks run in the test against the test database.

Each fault ends in one of two asserted outcomes: the promotion fails with the right code and
routing never moved, or it completes after the world recovered. Either way nothing is left in
flight and routing only ever moves after a passing probe.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from fleets.base import clock
from fleets.core.route_intent import build_route_intent
from fleets.models import Domain, Event, Fleet, Operation
from fleets.reads.selectors import fleet_view
from fleets.services.operations import operation_request
from supervisor.gpu.sim_state import SimGpuState
from tests.e2e.harness import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def promote(fleet, slug: str = "west") -> Operation:
    target = Domain.objects.get(fleet=fleet, slug=slug)
    return operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation


def finished(op: Operation):
    def check():
        op.refresh_from_db()
        return op if op.state not in ("pending", "running") else None

    return check


def seen(fleet):
    return lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet))


def route(fleet) -> dict:
    return build_route_intent(fleet_view(fleet), clock.now())


def assert_routing_moved_only_after_probe(op: Operation) -> None:
    events = list(Event.objects.filter(operation=op).order_by("id"))
    switched = [e.id for e in events if e.kind == "fleet.route.switched"]
    probed = [e.id for e in events if e.kind == "operation.step.done" and e.step == "probe"]
    assert len(switched) == 1 and len(probed) == 1
    assert probed[0] < switched[0]


def assert_routing_never_moved(fleet) -> None:
    fleet.refresh_from_db()
    assert fleet.route_revision == 1
    assert fleet.active_domain.slug == "east"
    assert not Event.objects.filter(fleet=fleet, kind="fleet.route.switched").exists()
    intent = route(fleet)
    assert intent["active"]["domainSlug"] == "east" and intent["active"]["eligible"]


def assert_nothing_in_flight(fleet) -> None:
    assert not Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists()


# -- the happy paths -------------------------------------------------------------------------


def test_manual_promote_flips_routing_and_the_old_active_ends_asleep_and_training(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    # East trained before it became active: its trainer must resume from this checkpoint.
    east.checkpoints.mkdir(parents=True, exist_ok=True)
    (east.checkpoints / "step-100000.json").write_text(json.dumps({"step": 100000}))
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "succeeded", op.error
    intent = route(fleet)
    assert intent["revision"] == 2
    assert intent["active"]["domainSlug"] == "west" and intent["active"]["eligible"]
    assert_routing_moved_only_after_probe(op)
    assert set(east.asleep().values()) == {True}
    assert set(west.asleep().values()) == {False}
    assert east.trainer()["state"] == "running" and east.trainer()["pids"]
    assert west.trainer()["state"] == "idle"
    # West's trainer saved on SIGTERM; east's resumed from its checkpoint.
    saved = [json.loads(p.read_text()) for p in west.checkpoints.glob("step-*.json")]
    assert any(c["reason"] == "sigterm" for c in saved)
    wait_for(lambda: "resumed from step 100000" in east.log(), 5, "east's trainer resume line")
    assert_nothing_in_flight(fleet)


def test_killing_the_active_supervisor_fails_over_to_the_standby(make_hosts, make_fleet, drive):
    east, west = make_hosts()
    # The dead old active cannot be slept: keep that best-effort wait short.
    fleet = make_fleet(east, west, {"sleepTimeoutMs": 800})
    drive(fleet, seen(fleet))

    east.crash()
    op = drive(
        fleet,
        lambda: Operation.objects.filter(
            fleet=fleet, reason="auto_failover", state="succeeded"
        ).first(),
        timeout=25,
    )

    intent = route(fleet)
    assert intent["active"]["domainSlug"] == "west" and intent["active"]["eligible"]
    assert intent["revision"] == 2
    assert op.detected_at is not None
    # The outage does not wait for the standby trainer's final save (failoverTrainingStopGraceMs).
    assert west.trainer()["killed"] is True
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] > 0
    assert_routing_moved_only_after_probe(op)
    assert_nothing_in_flight(fleet)


def test_a_supervisor_only_failover_has_one_figure_in_the_event_the_metrics_and_the_api(
    make_hosts, make_fleet, drive, client
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))

    os.kill(east.proc.pid, signal.SIGKILL)  # the supervisor only: its engines stay up
    # Its engines serve: degraded past degradedGraceMs (3 s), and never escalated for it.
    held = drive(
        fleet,
        lambda: Event.objects.filter(fleet=fleet, kind="domain.degraded.held").first(),
        timeout=30,
    )
    assert held.data["degradedForMs"] > 3000
    assert not Operation.objects.filter(fleet=fleet).exists()
    east.crash()  # then the engines die too: the data path fails, and the host is gone
    op = drive(
        fleet,
        lambda: Operation.objects.filter(
            fleet=fleet, reason="auto_failover", state="succeeded"
        ).first(),
        timeout=30,
    )

    assert op.detected_at is not None and op.served_at is not None
    # East's engines served on after its supervisor's last heartbeat: that heartbeat is not
    # when the outage began.
    assert op.source_seen_at is not None and op.detected_at > op.source_seen_at
    figure = int((op.served_at - op.detected_at).total_seconds() * 1000)
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] == figure
    report = client.get(f"/v1/fleets/{fleet.slug}/recovery").json()
    assert [s["totalMs"] for s in report["samples"]] == [figure]
    text = client.get("/metrics").content.decode()
    assert f"haru_failover_duration_seconds_sum {figure / 1000}" in text
    served = client.get(f"/v1/operations/{op.id}").json()["servedAt"]
    assert served == clock.iso(op.served_at)


# -- faults ----------------------------------------------------------------------------------


def test_a_trainer_that_ignores_sigterm_is_killed_after_grace_and_the_promotion_completes(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts(west={"trainer_args": ("--ignore-sigterm",), "grace_ms": 800})
    fleet = make_fleet(east, west, {"trainingStopGraceMs": 800})
    drive(fleet, seen(fleet))

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "succeeded", op.error
    stop = Event.objects.get(operation=op, kind="operation.step.done", step="stop_training")
    assert stop.duration_ms >= 800  # it took the SIGKILL after the grace
    assert west.trainer()["killed"] is True
    assert_routing_moved_only_after_probe(op)


def test_gpu_memory_that_is_not_released_fails_verify_gpu_and_never_routes(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    # A process the trainer left behind keeps 30 GiB on the card.
    zombie = subprocess.Popen(["sleep", "120"])
    try:
        SimGpuState(west.dir / "sim-gpu.json").hold(0, 30000, "leaked", pid=zombie.pid)
        op = drive(fleet, finished(promote(fleet)))
    finally:
        zombie.kill()
        zombie.wait()

    assert op.state == "failed"
    assert op.error["step"] == "verify_gpu" and op.error["code"] == "step_timeout"
    assert "GPU 0 holds" in op.error["message"]
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    # Standby posture restored: models were never woken, training restarted.
    cleanup = Event.objects.get(operation=op, kind="operation.cleanup.training")
    assert cleanup.data["ok"] is True
    assert west.trainer()["state"] == "running"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [({"wakeFails": True}, "wake_failed"), ({"wakeHangs": True}, "timed out")],
    ids=["wake-fails", "wake-hangs"],
)
def test_a_wake_that_fails_or_hangs_ends_in_step_timeout_and_never_routes(
    make_hosts, make_fleet, drive, fault, expected
):
    east, west = make_hosts()
    # Short budgets: a hung engine holds its lock, so the clean-up's sleep waits out its own.
    fleet = make_fleet(east, west, {"wakeTimeoutMs": 1500, "sleepTimeoutMs": 1000})
    drive(fleet, seen(fleet))
    west.fault("qwen-small", **fault)

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "failed"
    assert op.error["step"] == "wake" and op.error["code"] == "step_timeout"
    assert expected in op.error["message"]
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    assert Event.objects.filter(operation=op, kind="operation.cleanup.sleep").exists()


def test_a_failing_probe_never_moves_routing(make_hosts, make_fleet, drive):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    west.fault("qwen-small", inference5xx=True)

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "failed"
    assert op.error["step"] == "probe" and op.error["code"] == "probe_failed"
    assert "qwen-small" in op.error["message"] and "llama-small" not in op.error["message"]
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    # Back in standby posture: asleep again, trainer running.
    assert set(west.asleep().values()) == {True}
    assert west.trainer()["state"] == "running"


def test_a_supervisor_with_another_token_fails_the_promotion_as_unauthorized(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts(west_token="a-different-token-for-west-0123456789")
    fleet = make_fleet(east, west)
    drive(fleet, lambda: Domain.objects.get(fleet=fleet, slug="west").state == "degraded")

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "failed"
    assert op.error["code"] == "supervisor_unauthorized"
    assert op.error["step"] == "stop_training"
    assert "a-different-token" not in json.dumps(op.error)
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)


def test_a_supervisor_that_dies_mid_promotion_is_resumed_after_it_comes_back(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts(west={"wake_latency_ms": 1500})
    fleet = make_fleet(east, west, {"wakeTimeoutMs": 15000, "probeTimeoutMs": 10000})
    drive(fleet, seen(fleet))
    crashed = threading.Event()

    def crash_when_training_stopped():
        # The trainer exiting is the cue: verify_gpu and the 1.5 s wake come right after it.
        wait_for(lambda: west.trainer()["state"] == "idle", 20, "west's trainer stopped")
        time.sleep(0.4)
        west.crash()
        crashed.set()
        west.restart()

    watcher = threading.Thread(target=crash_when_training_stopped, daemon=True)
    watcher.start()
    op = promote(fleet)
    op = drive(fleet, finished(op), timeout=40)
    watcher.join(30)

    assert crashed.is_set()
    assert op.state == "succeeded", op.error
    assert_routing_moved_only_after_probe(op)
    assert set(west.asleep().values()) == {False}
    assert Fleet.objects.get(pk=fleet.pk).active_domain.slug == "west"
