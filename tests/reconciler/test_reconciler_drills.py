"""Drills driven by ticks against scripted supervisors and a fake clock: every way a check drill
can end (a failing step, a cancel, a real failover that pre-empts it) leaves the standby in its
posture, a failed drill raises the alarm, and the schedule's window is the tick's to apply."""

from __future__ import annotations

import re
from datetime import time, timedelta

import pytest

from fleets.core.policy import Policy
from fleets.models import Event, Fleet, Operation, Slot
from fleets.services.operations import operation_cancel, operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


def _drill(fleet) -> Operation:
    result = operation_request(fleet=fleet, kind="drill", target_domain_id=None, actor="test")
    assert result.operation is not None
    return result.operation


def _at_step(tick, fake_clock, op: Operation, step: str, limit: int = 20) -> Operation:
    """Tick (a second apart) until the drill waits at `step`."""
    for _ in range(limit):
        op.refresh_from_db()
        if op.state == "running" and op.current_step == step:
            return op
        assert op.state in ("pending", "running"), (op.state, op.error)
        fake_clock.advance(ms=1000)
        tick()
    raise AssertionError(f"the drill never waited at {step}")


def _past_budget(fleet, op: Operation, fake_clock) -> None:
    """Move the clock just past the current step's budget."""
    budget = Policy.resolve(fleet.policy).step_timeout_ms(op.current_step)
    assert op.step_started_at is not None
    due = op.step_started_at + timedelta(milliseconds=budget + 1)
    fake_clock.advance(ms=max(0.0, (due - fake_clock.now()).total_seconds() * 1000))


def _in_standby_posture(host, west) -> None:
    assert all(host.models.values()), host.models  # every model asleep
    assert host.trainer == "running" and host.pid is not None  # training restarted, with a PID
    assert {s.kind: s.state for s in Slot.objects.filter(domain=west)} == {
        "inference": "sleeping",
        "training": "training",
    }


def _routing_untouched(fleet, domains) -> None:
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["east"].id and fleet.route_revision == 1
    assert not Event.objects.filter(kind="fleet.route.switched").exists()


def _metric(client, name: str) -> float | None:
    text = client.get("/metrics").content.decode()
    match = re.search(rf'^{name}{{fleet="demo"}} ([0-9.e+-]+)$', text, flags=re.M)
    return float(match.group(1)) if match else None


def _break(host, step: str) -> None:
    """The persistent fault that keeps `step` from finishing."""
    if step == "verify_gpu":
        host.leak_mib = 60_000  # something else holds the trainer's memory
    elif step == "wake":
        host.wake_fails = True
    elif step == "sleep":
        host.sleep_fails = True
    else:
        host.start_fails = True


def _heal_after_one_more_failure(host, step: str) -> None:
    """The fault clears, but the step's last attempt still fails: the clean-up after the
    failure is the first call to find the host working again."""
    if step == "sleep":
        host.sleep_fails = False
        host.failing["POST /v1/vllm/sleep"] = 1
    elif step == "start_training":
        host.start_fails = False
        host.failing["POST /v1/training/start"] = 1
    # verify_gpu and wake leave the models asleep: the clean-up restarts training regardless.


@pytest.mark.parametrize("step", ["verify_gpu", "wake", "sleep", "start_training"])
def test_a_check_drill_failing_at_a_step_ends_failed_alerts_and_restores_standby_posture(
    fleet, tick, hosts, domains, fake_clock, client, step
):
    west = hosts.hosts["west"]
    tick()
    _break(west, step)
    op = _at_step(tick, fake_clock, _drill(fleet), step)
    _heal_after_one_more_failure(west, step)
    _past_budget(fleet, op, fake_clock)

    tick()

    op.refresh_from_db()
    assert op.state == "failed" and op.error["step"] == step
    assert op.error["code"] == "step_timeout", op.error
    alert = Event.objects.get(operation=op, kind="drill.failed")
    assert alert.step == step and alert.data["domain"] == "west"
    assert alert.data["code"] == "step_timeout"
    assert op.cleanup == "done"
    _in_standby_posture(west, domains()["west"])
    _routing_untouched(fleet, domains)
    assert _metric(client, "haru_drill_last_passed") == 0
    # Nothing is left in flight, and the readiness verdict names the failure.
    assert not Operation.objects.filter(state__in=["pending", "running"]).exists()
    drill = client.get("/v1/fleets/demo").json()["failoverReadiness"]["reasons"][-1]
    assert drill["check"] == "drill" and drill["ok"] is False
    assert drill["message"].startswith("the last drill failed: step_timeout")


def test_a_drill_whose_sleep_never_comes_back_is_restored_once_the_host_heals(
    fleet, tick, hosts, domains, fake_clock
):
    west = hosts.hosts["west"]
    tick()
    west.sleep_fails = True
    op = _at_step(tick, fake_clock, _drill(fleet), "sleep")
    _past_budget(fleet, op, fake_clock)
    tick()
    op.refresh_from_db()
    assert op.state == "failed" and op.error["step"] == "sleep"
    assert Event.objects.filter(operation=op, kind="drill.failed").count() == 1
    # The clean-up could not sleep the models either: it says so and leaves training off.
    assert op.cleanup == "incomplete"
    sleep = Event.objects.get(operation=op, kind="operation.cleanup.sleep")
    assert sleep.data["ok"] is False
    assert not any(west.models.values()) and west.trainer == "idle"

    west.sleep_fails = False
    for _ in range(10):  # the restore-standby pass takes it from here, no operator needed
        fake_clock.advance(ms=1000)
        tick()
    _in_standby_posture(west, domains()["west"])
    restore = Operation.objects.filter(kind="demote", state="succeeded").get()
    assert restore.target_domain_id == domains()["west"].id


def test_a_passed_drill_sets_drill_last_passed_to_one_and_a_failed_one_to_zero(
    fleet, tick, hosts, domains, fake_clock, client
):
    tick()
    assert _metric(client, "haru_drill_last_passed") is None  # no drill yet: no series
    passed = _drill(fleet)
    assert run_until_done(tick, clock=fake_clock, step_ms=1000).id == passed.id
    passed.refresh_from_db()
    assert passed.state == "succeeded", passed.error
    assert _metric(client, "haru_drill_last_passed") == 1
    assert passed.finished_at is not None
    stamp = _metric(client, "haru_drill_last_finished_timestamp_seconds")
    assert stamp == passed.finished_at.timestamp()
    _in_standby_posture(hosts.hosts["west"], domains()["west"])

    fake_clock.advance(ms=1000)
    tick()
    hosts.hosts["west"].probe_fails = {"llama-small"}
    failed = _drill(fleet)
    run_until_done(tick, clock=fake_clock, step_ms=1000)
    failed.refresh_from_db()
    assert failed.state == "failed" and failed.error["code"] == "probe_failed"
    assert _metric(client, "haru_drill_last_passed") == 0
    assert failed.finished_at is not None
    stamp = _metric(client, "haru_drill_last_finished_timestamp_seconds")
    assert stamp == failed.finished_at.timestamp()


def _mid_probe(tick, hosts, fake_clock, fleet) -> Operation:
    """A check drill half-way: training stopped, models awake, its probe not answered yet (the
    supervisor's probe answers 502 until the test clears it)."""
    west = hosts.hosts["west"]
    west.failing["POST /v1/probe"] = 1_000
    op = _at_step(tick, fake_clock, _drill(fleet), "probe")
    assert not any(west.models.values()) and west.trainer == "idle"
    return op


def test_a_cancelled_drill_restores_standby_posture(fleet, tick, hosts, domains, fake_clock):
    tick()
    op = _mid_probe(tick, hosts, fake_clock, fleet)

    assert operation_cancel(operation_id=op.id, actor="ops", message="not now")
    op.refresh_from_db()
    assert op.state == "cancelled" and op.cleanup == "pending"
    tick()

    op.refresh_from_db()
    assert op.cleanup == "done"
    _in_standby_posture(hosts.hosts["west"], domains()["west"])
    _routing_untouched(fleet, domains)
    assert not Event.objects.filter(operation=op, kind="operation.step.done", step="probe")
    # A cancel is not a failed drill: no alarm.
    assert not Event.objects.filter(kind="drill.failed").exists()


def test_a_real_failover_preempts_a_drill_and_its_clean_up_leaves_the_new_active_alone(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    drill = _mid_probe(tick, hosts, fake_clock, fleet)

    hosts.hosts["east"].down = True  # the active's host dies mid-drill
    tick()  # unreachable: degraded, and the drill goes on
    drill.refresh_from_db()
    assert (drill.state, drill.current_step) == ("running", "probe")
    fake_clock.advance(ms=3001)  # past heartbeatStaleMs: the active is lost

    tick()

    drill.refresh_from_db()
    assert (drill.state, drill.error["code"]) == ("cancelled", "preempted")
    failover = Operation.objects.get(kind="promote")
    assert failover.reason == "auto_failover"
    assert failover.target_domain_id == domains()["west"].id
    hosts.hosts["west"].failing.clear()  # the standby's probe answers again
    done = run_until_done(tick, clock=fake_clock, step_ms=5000)
    assert done is not None and done.id == failover.id and done.state == "succeeded", done.error
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id
    # The drill's clean-up did not sleep what now serves traffic.
    drill.refresh_from_db()
    assert drill.cleanup == "skipped"
    skipped = Event.objects.get(operation=drill, kind="operation.cleanup.finished")
    assert "west" in skipped.data["message"]
    assert not any(hosts.hosts["west"].models.values())
    assert {s.kind: s.state for s in Slot.objects.filter(domain=domains()["west"])}[
        "inference"
    ] == "serving"
    assert not Event.objects.filter(kind="drill.failed").exists()


def _schedule(fleet, start: time, end: time) -> None:
    Fleet.objects.filter(pk=fleet.pk).update(
        drill_interval_minutes=60, drill_window_start=start, drill_window_end=end
    )


def _drills(fleet) -> int:
    return Operation.objects.filter(fleet=fleet, kind="drill").count()


def test_the_tick_requests_a_due_drill_only_inside_the_window(fleet, tick, hosts, fake_clock):
    assert fake_clock.now().time() == time(0, 0)
    _schedule(fleet, time(2, 0), time(4, 0))
    tick()
    assert _drills(fleet) == 0  # due (never drilled) but outside the window
    fake_clock.advance(seconds=2 * 3600 - 1)
    tick()
    assert _drills(fleet) == 0  # 01:59:59
    fake_clock.advance(seconds=1)
    tick()
    op = Operation.objects.get(fleet=fleet, kind="drill")
    assert op.reason == "scheduled_drill" and op.created_at.time() == time(2, 0)


def test_a_window_that_wraps_midnight_runs_drills_on_both_sides_of_it(
    fleet, tick, hosts, fake_clock
):
    _schedule(fleet, time(23, 0), time(1, 0))
    tick()  # 00:00: inside the wrapped window
    assert _drills(fleet) == 1
    run_until_done(tick, clock=fake_clock, step_ms=1000)
    fake_clock.advance(seconds=90 * 60)  # 01:30: due again, but the window closed at 01:00
    tick()
    assert _drills(fleet) == 1
    fake_clock.advance(seconds=21 * 3600 + 29 * 60)  # 22:59
    tick()
    assert _drills(fleet) == 1
    fake_clock.advance(seconds=60)  # 23:00
    tick()
    assert _drills(fleet) == 2
