"""Whole operations driven by ticks against scripted supervisors and a fake clock."""

from __future__ import annotations

import pytest

from fleets.core.states import PROMOTE_STEPS, Step
from fleets.models import Event, Fleet, Operation, Slot
from fleets.reconciler.steps.base import SWITCH_QUIET_MS, switch_settle_ms
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


def run_until_done(tick, limit: int = 20, clock=None, step_ms: int = 0) -> Operation | None:
    """Tick until nothing is in flight (moving `clock` by `step_ms` between ticks)."""
    last = None
    for _ in range(limit):
        if clock is not None:
            clock.advance(ms=step_ms)
        result = tick()
        last = result.operation_id or last
        if not Operation.objects.filter(state__in=["pending", "running"]).exists():
            return Operation.objects.filter(pk=last).first() if last else None
    raise AssertionError(f"operation still in flight after {limit} ticks")


def slot_states(domain) -> dict[str, str]:
    return {s.kind: s.state for s in Slot.objects.filter(domain=domain)}


def test_manual_promotion_flips_routing_and_puts_the_old_active_in_standby(
    fleet, tick, hosts, domains, fake_clock
):
    tick()  # first heartbeat: west's running trainer is mirrored
    west = domains()["west"]
    assert slot_states(west) == {"inference": "sleeping", "training": "training"}

    result = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    # The old active is slept only once proxies moved off it: time must pass.
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)

    assert op.id == result.operation.id
    assert op.state == "succeeded", op.error
    fleet.refresh_from_db()
    assert fleet.active_domain_id == west.id
    assert fleet.route_revision == 2
    d = domains()
    assert slot_states(d["west"]) == {"inference": "serving", "training": "idle"}
    assert slot_states(d["east"]) == {"inference": "sleeping", "training": "training"}
    # The old active ends asleep with its trainer running (with a PID), the new one awake.
    assert all(hosts.hosts["east"].models[m] is True for m in hosts.hosts["east"].models)
    assert hosts.hosts["east"].trainer == "running" and hosts.hosts["east"].pid
    assert not any(hosts.hosts["west"].models.values())
    assert hosts.hosts["west"].trainer == "idle"
    # Every step recorded exactly once, in order.
    steps = list(
        Event.objects.filter(operation=op, kind="operation.step.done")
        .order_by("id")
        .values_list("step", flat=True)
    )
    assert steps == list(PROMOTE_STEPS)
    assert Event.objects.filter(operation=op, kind="fleet.route.switched").count() == 1


def test_demotion_sleeps_a_standby_and_starts_its_training(fleet, tick, hosts, domains):
    west_host = hosts.hosts["west"]
    west_host.models = {m: False for m in west_host.models}  # awake by mistake
    west_host.trainer, west_host.pid = "idle", None
    west = domains()["west"]

    operation_request(fleet=fleet, kind="demote", target_domain_id=west.id)
    op = run_until_done(tick)

    assert op.state == "succeeded", op.error
    assert all(west_host.models.values())
    assert west_host.trainer == "running"
    assert slot_states(domains()["west"]) == {"inference": "sleeping", "training": "training"}
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 1


def test_auto_failover_promotes_the_standby_when_the_active_goes_stale(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    # A partition (every call times out), not a dead host: only the stale window decides.
    hosts.hosts["east"].partitioned = True
    tick()  # east unreachable: degraded, but not stale yet
    assert domains()["east"].state == "degraded"
    assert not Operation.objects.exists()

    fake_clock.advance(ms=3001)  # heartbeatStaleMs of the demo policy is 3000
    west_host = hosts.hosts["west"]
    op = run_until_done(tick, clock=fake_clock, step_ms=5000)

    assert op.reason == "auto_failover"
    assert op.detected_at is not None
    assert op.state == "succeeded", op.error
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id
    assert not any(west_host.models.values())
    # The dead old active could not be slept: the best-effort steps advanced anyway.
    kinds = dict(
        Event.objects.filter(operation=op, step__in=["demote_old_sleep", "demote_old_train"])
        .exclude(kind="operation.started")
        .values_list("step", "kind")
    )
    assert kinds["demote_old_sleep"] == "operation.step.timeout_best_effort"
    assert kinds["demote_old_train"] == "operation.step.skipped"
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] >= 0
    assert Event.objects.filter(operation=op, kind="operation.auto_failover").count() == 1


def test_no_failover_without_auto_failover(fleet, tick, hosts, fake_clock):
    fleet.policy = {**fleet.policy, "autoFailover": False}
    fleet.save(update_fields=["policy"])
    tick()
    hosts.hosts["east"].down = True
    fake_clock.advance(ms=60_000)
    tick()
    assert not Operation.objects.exists()


def _fail_over_with_east_dead(tick, hosts, fake_clock) -> Operation:
    tick()
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)
    return run_until_done(tick, clock=fake_clock, step_ms=5000)


def test_a_former_active_back_late_and_awake_is_restored_to_standby_posture(
    fleet, tick, hosts, domains, fake_clock
):
    failover = _fail_over_with_east_dead(tick, hosts, fake_clock)
    assert failover.state == "succeeded"
    east_host = hosts.hosts["east"]
    # The host returns long after the promotion gave up on it: models awake, no trainer.
    east_host.down = False
    east_host.models = {m: False for m in east_host.models}
    east_host.trainer, east_host.pid = "idle", None

    # Heartbeats bring it from failed through degraded to ready; then the demotion starts.
    for _ in range(4):
        fake_clock.advance(ms=100)
        tick()
        if Operation.objects.filter(kind="demote").exists():
            break
    run_until_done(tick, clock=fake_clock, step_ms=100)
    restore = Operation.objects.get(kind="demote")

    assert restore.kind == "demote" and restore.reason == "restore_standby"
    assert restore.target_domain_id == domains()["east"].id
    assert restore.state == "succeeded", restore.error
    assert all(east_host.models.values()) and east_host.trainer == "running"
    assert slot_states(domains()["east"]) == {"inference": "sleeping", "training": "training"}
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id  # routing never moves


def test_restore_on_return_off_leaves_the_returned_host_awake(
    fleet, tick, hosts, domains, fake_clock
):
    fleet.policy = {**fleet.policy, "restoreStandbyOnReturn": False}
    fleet.save(update_fields=["policy"])
    _fail_over_with_east_dead(tick, hosts, fake_clock)
    east_host = hosts.hosts["east"]
    east_host.down = False
    east_host.models = {m: False for m in east_host.models}

    for _ in range(6):  # more ticks than the restore needs with the policy on
        fake_clock.advance(ms=100)
        tick()

    assert not Operation.objects.filter(kind="demote").exists()
    assert slot_states(domains()["east"])["inference"] == "failed"


def test_each_retry_of_a_failing_wake_is_an_event_until_the_step_times_out(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    hosts.hosts["west"].wake_fails = True
    operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)

    op = run_until_done(tick, limit=40, clock=fake_clock, step_ms=1000)

    assert op.state == "failed" and op.error["code"] == "step_timeout"
    retries = list(Event.objects.filter(operation=op, kind="operation.step.retry").order_by("id"))
    assert len(retries) >= 2
    assert {e.step for e in retries} == {"wake"}
    assert [e.data["attempt"] for e in retries] == list(range(1, len(retries) + 1))
    assert "wake failed" in retries[0].data["message"]
    assert all(e.domain_id == domains()["west"].id for e in retries)


def _pauses(monkeypatch, fake_clock) -> list[tuple[str | None, float]]:
    """Record each pause of the tick through the clock: the last step recorded done when it
    began, and its length."""
    pauses: list[tuple[str | None, float]] = []
    moves_on = fake_clock.sleep

    def sleep(seconds: float) -> None:
        last = Event.objects.filter(kind="operation.step.done").order_by("-id").first()
        pauses.append((last.step if last else None, seconds))
        moves_on(seconds)

    monkeypatch.setattr(fake_clock, "sleep", sleep)
    return pauses


def test_the_tick_that_moves_routing_leaves_the_host_to_the_burst_it_released(
    fleet, tick, hosts, domains, fake_clock, monkeypatch
):
    tick()
    west = domains()["west"]
    operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    pauses = _pauses(monkeypatch, fake_clock)
    tick(poll_s=2.0)  # a tick that may wait in the call, as the reconcile loops' do
    fleet.refresh_from_db()
    assert fleet.active_domain_id == west.id
    # Once, right after the switch was recorded, before the next step was looked at.
    assert pauses == [(Step.SWITCH_ROUTE, SWITCH_QUIET_MS / 1000)]
    assert switch_settle_ms() > SWITCH_QUIET_MS  # the next step waits longer anyway


def test_a_tick_that_may_not_wait_does_not_pause_after_the_switch(
    fleet, tick, hosts, domains, fake_clock, monkeypatch
):
    tick()
    operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    pauses = _pauses(monkeypatch, fake_clock)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)  # poll_s=0: hand back at once
    assert op is not None and op.state == "succeeded", op and op.error
    assert pauses == []
