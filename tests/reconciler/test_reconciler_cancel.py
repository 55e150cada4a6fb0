"""Cancel, pre-emption and the recorded clean-up, driven by ticks against scripted supervisors."""

from __future__ import annotations

import pytest

from fleets.models import Event, Fleet, Operation, Slot
from fleets.reconciler import advance
from fleets.reconciler.steps import promote
from fleets.reconciler.steps.cleanup import CLEANUP_LEASE_MS
from fleets.services.operations import (
    operation_cancel,
    operation_cleanup_claim,
    operation_request,
)

pytestmark = pytest.mark.django_db


class WorkerDied(BaseException):
    """The process ends here: nothing after it in the tick runs (not an Exception: no handler
    on the way up may swallow it)."""


def die(**kwargs):
    raise WorkerDied


def fail_and_die(tick, monkeypatch) -> None:
    """Run the tick that fails the promotion; the worker dies right after the failure commits."""
    monkeypatch.setattr(advance, "cleanup_after_failure", die)
    with pytest.raises(WorkerDied):
        tick()
    monkeypatch.undo()


def slot_states(domain) -> dict[str, str]:
    return {s.kind: s.state for s in Slot.objects.filter(domain=domain)}


def events(op, kind: str) -> list[Event]:
    return list(Event.objects.filter(operation=op, kind=kind).order_by("id"))


def promote_west(fleet, domains) -> Operation:
    result = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    return result.operation


def _routing_untouched(fleet, domains) -> None:
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["east"].id
    assert fleet.route_revision == 1
    assert not Event.objects.filter(kind="fleet.route.switched").exists()


def test_a_cancelled_promotion_restores_the_standby_posture_at_the_next_tick(
    fleet, tick, hosts, domains
):
    tick()
    op = promote_west(fleet, domains)
    west = hosts.hosts["west"]
    tick(budget_s=0)  # starts it, runs no step
    # Where a promotion stands mid-way: trainer stopped, models woken, probe next.
    Operation.objects.filter(pk=op.pk).update(current_step="probe")
    west.models = {m: False for m in west.models}
    west.trainer, west.pid = "idle", None

    assert operation_cancel(operation_id=op.id, actor="ops", message="changed my mind")
    op.refresh_from_db()
    assert op.state == "cancelled" and op.cleanup == "pending"
    assert op.error == {"step": "probe", "code": "cancelled", "message": "changed my mind"}

    tick()

    op.refresh_from_db()
    assert op.cleanup == "done"
    assert all(west.models.values()) and west.trainer == "running"
    assert slot_states(domains()["west"]) == {"inference": "sleeping", "training": "training"}
    assert len(events(op, "operation.cleanup.finished")) == 1
    assert not events(op, "operation.step.done")  # the tick saw it cancelled: no step ran
    _routing_untouched(fleet, domains)
    tick()  # finished means finished: nothing runs again
    assert len(events(op, "operation.cleanup.sleep")) == 1


def test_a_cancel_committed_just_before_the_switch_keeps_routing_where_it_was(
    fleet, tick, hosts, domains, monkeypatch
):
    tick()
    op = promote_west(fleet, domains)
    real_switch = promote.route_switch

    def cancel_then_switch(**kwargs):
        # The operator's cancel commits between the step's read and its compare-and-swap.
        assert operation_cancel(operation_id=kwargs["operation_id"], actor="ops")
        return real_switch(**kwargs)

    monkeypatch.setattr(promote, "route_switch", cancel_then_switch)
    tick()

    op.refresh_from_db()
    assert op.state == "cancelled" and op.routing_committed is False
    assert op.error["step"] == "switch_route"
    _routing_untouched(fleet, domains)
    # The cancel is noticed between steps: nothing after switch_route ran.
    done = {e.step for e in events(op, "operation.step.done")}
    assert done == {"stop_training", "verify_gpu", "wake", "probe"}
    # Same tick: the woken target went back to standby posture.
    assert op.cleanup == "done"
    assert all(hosts.hosts["west"].models.values())
    assert hosts.hosts["west"].trainer == "running"


def test_a_cancel_after_the_switch_is_refused_and_the_promotion_finishes(
    fleet, tick, hosts, domains, monkeypatch, fake_clock
):
    tick()
    op = promote_west(fleet, domains)
    real_switch = promote.route_switch
    refused = []

    def switch_then_cancel(**kwargs):
        revision = real_switch(**kwargs)
        refused.append(operation_cancel(operation_id=kwargs["operation_id"], actor="ops"))
        return revision

    monkeypatch.setattr(promote, "route_switch", switch_then_cancel)
    tick()
    # The old active is slept only once proxies have moved off it (promote.switch_settle_ms).
    fake_clock.advance(ms=promote.switch_settle_ms() + 1)
    tick()
    op.refresh_from_db()
    assert refused == [False]
    assert op.state == "succeeded" and op.cleanup == ""
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["west"].id


def test_a_clean_up_lost_with_its_worker_is_finished_by_the_next_tick_exactly_once(
    fleet, tick, hosts, domains, monkeypatch
):
    tick()
    west = hosts.hosts["west"]
    west.probe_fails = {"qwen-small"}
    op = promote_west(fleet, domains)
    fail_and_die(tick, monkeypatch)
    op.refresh_from_db()
    assert op.state == "failed" and op.cleanup == "pending"
    assert not any(west.models.values())  # left awake

    tick()  # a fresh worker

    op.refresh_from_db()
    assert op.cleanup == "done"
    assert all(west.models.values()) and west.trainer == "running"
    assert west.effects["trainer_started"] == 1
    tick()
    tick()
    assert len(events(op, "operation.cleanup.sleep")) == 1
    assert len(events(op, "operation.cleanup.training")) == 1
    assert [e.data["outcome"] for e in events(op, "operation.cleanup.finished")] == ["done"]
    assert west.effects["trainer_started"] == 1
    _routing_untouched(fleet, domains)


def test_a_clean_up_held_by_a_live_lease_waits_and_a_dead_one_is_taken_over(
    fleet, tick, hosts, domains, fake_clock, monkeypatch
):
    tick()
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    op = promote_west(fleet, domains)
    fail_and_die(tick, monkeypatch)
    # Another worker claimed it, then froze.
    assert operation_cleanup_claim(operation_id=op.id, lease_ms=CLEANUP_LEASE_MS)
    tick()
    op.refresh_from_db()
    assert op.cleanup == "pending" and not events(op, "operation.cleanup.sleep")

    fake_clock.advance(ms=CLEANUP_LEASE_MS)
    tick()
    op.refresh_from_db()
    assert op.cleanup == "done"
    assert len(events(op, "operation.cleanup.sleep")) == 1


def test_a_clean_up_never_sleeps_the_active_domain(fleet, tick, hosts, domains, monkeypatch):
    tick()
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    op = promote_west(fleet, domains)
    fail_and_die(tick, monkeypatch)
    # By the time the clean-up runs, routing moved to west some other way.
    Fleet.objects.filter(pk=fleet.pk).update(active_domain_id=domains()["west"].id)
    slept_before = hosts.hosts["west"].effects["slept"]

    tick()

    op.refresh_from_db()
    assert op.cleanup == "skipped"
    assert hosts.hosts["west"].effects["slept"] == slept_before
    finished = events(op, "operation.cleanup.finished")[0]
    assert "active domain" in finished.data["message"]


def test_a_demote_stuck_on_a_failing_sleep_is_preempted_when_the_active_crashes(
    fleet, tick, hosts, domains, fake_clock
):
    west = hosts.hosts["west"]
    west.models = {m: False for m in west.models}  # awake by mistake: demote it
    west.trainer, west.pid = "idle", None
    west.sleep_fails = True
    tick()
    demote = operation_request(
        fleet=fleet, kind="demote", target_domain_id=domains()["west"].id
    ).operation
    tick()
    demote.refresh_from_db()
    assert demote.state == "running" and demote.current_step == "sleep"

    hosts.hosts["east"].down = True
    tick()  # east unreachable: degraded, not stale yet; the demote keeps going
    demote.refresh_from_db()
    assert demote.state == "running"
    fake_clock.advance(ms=3001)  # past heartbeatStaleMs: the active is lost

    tick()  # one tick

    demote.refresh_from_db()
    assert demote.state == "cancelled"
    assert demote.error["code"] == "preempted"
    cancelled = events(demote, "operation.cancelled")
    assert len(cancelled) == 1 and cancelled[0].data["reason"] == "preempted"
    failover = Operation.objects.exclude(pk=demote.pk).get()
    assert failover.kind == "promote" and failover.reason == "auto_failover"
    assert failover.target_domain_id == domains()["west"].id
    assert failover.state in ("running", "succeeded")
    assert failover.started_at is not None  # started in the same tick, not queued


def test_a_degraded_active_escalates_past_a_stuck_demote_and_fails_over(
    fleet, tick, hosts, domains, fake_clock
):
    west = hosts.hosts["west"]
    west.trainer, west.pid = "idle", None
    west.start_without_pid = True  # the trainer never proves it runs: start_training waits
    tick()
    demote = operation_request(
        fleet=fleet, kind="demote", target_domain_id=domains()["west"].id
    ).operation
    tick()
    demote.refresh_from_db()
    assert (demote.state, demote.current_step) == ("running", "start_training")

    hosts.hosts["east"].models["qwen-small"] = True  # reachable, but not serving everything
    tick()
    assert domains()["east"].state == "degraded"
    fake_clock.advance(ms=5001)  # past degradedGraceMs of the demo policy

    tick()

    assert domains()["east"].state == "failed"
    demote.refresh_from_db()
    assert (demote.state, demote.error["code"]) == ("cancelled", "preempted")
    failover = Operation.objects.exclude(pk=demote.pk).get()
    assert (failover.kind, failover.reason) == ("promote", "auto_failover")
    assert failover.started_at is not None


def test_an_in_flight_promotion_of_a_serving_standby_is_not_preempted(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    west = hosts.hosts["west"]
    west.stop_polls = 1000  # the trainer takes its time: the promotion stays in flight
    op = promote_west(fleet, domains)
    tick()
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)
    tick()
    op.refresh_from_db()
    assert op.state == "running"
    assert Operation.objects.count() == 1
