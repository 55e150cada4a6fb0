"""Operations that already moved routing, when the domain they routed to is lost or an operator
cancels them (issue 11, finding 13): a promotion's best-effort steps on the old active are
pre-empted, and a round-trip drill ends without fighting the failover. Ticks against scripted
supervisors (tests/reconciler/fakes.py) under a fake clock."""

from __future__ import annotations

import pytest

from fleets.models import Event, Fleet, Operation
from fleets.reconciler.steps.base import switch_settle_ms
from fleets.services.operations import (
    operation_cancel_request,
    operation_fail,
    operation_request,
    operation_step_done,
)

pytestmark = pytest.mark.django_db

BEST_EFFORT = ["demote_old_sleep", "demote_old_train"]


def events(op, kind: str) -> list[Event]:
    return list(Event.objects.filter(operation=op, kind=kind).order_by("id"))


def switches(fleet) -> list[tuple[str, str, str | None]]:
    """Every pointer move: (from slug, to slug, the operation's kind)."""
    names = {str(d.id): d.slug for d in fleet.domains.all()}
    return [
        (names[e.data["fromDomainId"]], names[e.data["toDomainId"]], e.operation.kind)
        for e in Event.objects.filter(fleet=fleet, kind="fleet.route.switched")
        .select_related("operation")
        .order_by("id")
    ]


def committed_promotion_stuck_on_east(fleet, tick, hosts, domains, fake_clock) -> Operation:
    """Promote west; routing moves; the best-effort sleep of east (the old active) keeps failing."""
    tick()
    hosts.hosts["east"].sleep_fails = True
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    promotion = op.operation
    tick()
    fake_clock.advance(ms=switch_settle_ms() + 1)  # proxies have moved off east: sleep it
    tick()
    promotion.refresh_from_db()
    assert (promotion.state, promotion.current_step) == ("running", "demote_old_sleep")
    assert promotion.routing_committed
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["west"].id
    assert not any(hosts.hosts["east"].models.values())  # its sleep failed: still awake
    return promotion


def lose_west(tick, hosts, fake_clock) -> None:
    """The new active crashes: unreachable for one tick, then past heartbeatStaleMs."""
    hosts.hosts["west"].down = True
    tick()
    fake_clock.advance(ms=3001)


def test_a_committed_promotion_whose_new_active_crashes_is_preempted_and_fails_over_in_one_tick(
    fleet, tick, hosts, domains, fake_clock
):
    promotion = committed_promotion_stuck_on_east(fleet, tick, hosts, domains, fake_clock)
    revision = Fleet.objects.get(pk=fleet.pk).route_revision
    lose_west(tick, hosts, fake_clock)

    tick()  # one tick

    promotion.refresh_from_db()
    # It did move routing: succeeded, never "cancelled"; what it did not do is on record.
    assert promotion.state == "succeeded" and promotion.error is None
    assert promotion.cleanup == ""
    skipped = events(promotion, "operation.step.skipped")
    assert [e.step for e in skipped] == BEST_EFFORT
    assert {e.data["reason"] for e in skipped} == {"preempted"}
    assert {e.domain_id for e in skipped} == {domains()["east"].id}
    assert skipped[0].duration_ms is not None and skipped[1].duration_ms is None
    (succeeded,) = events(promotion, "operation.succeeded")
    assert succeeded.data == {"skippedSteps": BEST_EFFORT, "reason": "preempted"}
    assert not events(promotion, "operation.cancelled")
    # The failover back to east was requested and started in the same tick.
    failover = Operation.objects.exclude(pk=promotion.pk).get()
    assert (failover.kind, failover.reason) == ("promote", "auto_failover")
    assert failover.target_domain_id == domains()["east"].id
    assert failover.source_domain_id == domains()["west"].id
    assert failover.started_at is not None
    # east was awake all along (its sleep kept failing): routing moved, exactly once more.
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["east"].id
    assert fleet.route_revision == revision + 1
    assert switches(fleet) == [("east", "west", "promote"), ("west", "east", "promote")]
    assert Event.objects.get(operation=failover, kind="fleet.route.switched")


def test_a_step_that_finishes_after_the_preemption_changes_nothing(
    fleet, tick, hosts, domains, fake_clock
):
    promotion = committed_promotion_stuck_on_east(fleet, tick, hosts, domains, fake_clock)
    lose_west(tick, hosts, fake_clock)
    tick()
    promotion.refresh_from_db()
    finished_at = promotion.finished_at
    before = Event.objects.filter(operation=promotion).count()

    # A worker that was still inside demote_old_sleep reports in late: its guard is on the
    # operation's state and step, so nothing moves.
    assert not operation_step_done(operation_id=promotion.id, step="demote_old_sleep")
    assert not operation_fail(
        operation_id=promotion.id, step="demote_old_sleep", code="step_timeout", message="late"
    )

    promotion.refresh_from_db()
    assert (promotion.state, promotion.finished_at) == ("succeeded", finished_at)
    assert Event.objects.filter(operation=promotion).count() == before


def test_a_committed_promotion_whose_new_active_is_healthy_is_left_to_finish(
    fleet, tick, hosts, domains, fake_clock
):
    promotion = committed_promotion_stuck_on_east(fleet, tick, hosts, domains, fake_clock)
    for _ in range(4):  # well past heartbeatStaleMs, inside sleepTimeoutMs
        fake_clock.advance(ms=1500)
        tick()
    promotion.refresh_from_db()
    assert (promotion.state, promotion.current_step) == ("running", "demote_old_sleep")
    assert Operation.objects.count() == 1
    assert not events(promotion, "operation.step.skipped")

    hosts.hosts["east"].sleep_fails = False  # the old active's sleep finally works
    for _ in range(3):
        tick()
    promotion.refresh_from_db()
    assert promotion.state == "succeeded"
    assert {e.step for e in events(promotion, "operation.step.done")} >= set(BEST_EFFORT)
    assert all(hosts.hosts["east"].models.values())


def test_an_operator_cancel_after_the_switch_succeeds_it_and_the_old_active_is_restored(
    fleet, tick, hosts, domains, fake_clock
):
    promotion = committed_promotion_stuck_on_east(fleet, tick, hosts, domains, fake_clock)
    revision = Fleet.objects.get(pk=fleet.pk).route_revision

    outcome = operation_cancel_request(
        fleet_id=fleet.id, operation_id=str(promotion.id), actor="ops"
    )

    assert outcome.status == "succeeded"
    assert outcome.skipped_steps == tuple(BEST_EFFORT)
    assert outcome.operation.state == "succeeded"
    skipped = events(promotion, "operation.step.skipped")
    assert [(e.step, e.data["reason"], e.actor) for e in skipped] == [
        (step, "cancelled", "ops") for step in BEST_EFFORT
    ]
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["west"].id and fleet.route_revision == revision
    assert Operation.objects.count() == 1  # nothing else was started by the cancel

    # The old active's posture is the restore-standby pass's job, once its sleep works again.
    east = hosts.hosts["east"]
    east.sleep_fails = False
    for _ in range(6):
        fake_clock.advance(ms=200)
        tick()
    restore = Operation.objects.get(kind="demote")
    assert (restore.reason, restore.target_domain_id) == ("restore_standby", domains()["east"].id)
    assert restore.state == "succeeded", restore.error
    assert all(east.models.values()) and east.trainer == "running"
    assert Fleet.objects.get(pk=fleet.pk).route_revision == revision  # routing never moved


# -- round-trip drills -------------------------------------------------------------------------


def round_trip(fleet) -> Operation:
    result = operation_request(
        fleet=fleet, kind="drill", target_domain_id=None, actor="test", drill_mode="round_trip"
    )
    assert result.operation is not None
    return result.operation


def drive_to(op: Operation, step: str, tick, fake_clock, limit: int = 8) -> None:
    for _ in range(limit):
        op.refresh_from_db()
        if op.current_step == step:
            return
        fake_clock.advance(ms=switch_settle_ms() + 1)
        tick()
    raise AssertionError(f"drill never reached {step} (at {op.current_step}, {op.state})")


def test_a_round_trip_drill_losing_its_standby_after_the_first_switch_leaves_routing_alone(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    hosts.hosts["east"].sleep_fails = True  # the drill's demotion of the original hangs
    drill = round_trip(fleet)
    tick()
    drive_to(drill, "demote_old_sleep", tick, fake_clock)
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["west"].id
    lose_west(tick, hosts, fake_clock)

    # The pre-empting tick starts the failover but runs none of its steps: the drill's clean-up
    # runs while the failover is in flight, which is when it could fight it for the pointer.
    tick(budget_s=0)

    drill.refresh_from_db()
    assert (drill.state, drill.error["code"]) == ("cancelled", "preempted")
    failover = Operation.objects.get(reason="auto_failover")
    assert failover.target_domain_id == domains()["east"].id
    assert failover.started_at is not None
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["west"].id
    (route_back,) = events(drill, "operation.cleanup.route_back")
    assert route_back.data["ok"] is False and str(failover.id) in route_back.data["message"]
    # Its clean-up never puts the failover's target to sleep.
    assert drill.cleanup == "skipped" and not events(drill, "operation.cleanup.sleep")

    for _ in range(3):
        tick()
    failover.refresh_from_db()
    assert failover.routing_committed
    # Routing moved exactly once more, by the failover's own switch, not by a route-back.
    assert switches(fleet) == [("east", "west", "drill"), ("west", "east", "promote")]
    assert not Event.objects.filter(data__reason="drill_failed_route_back").exists()


def test_a_round_trip_drill_losing_its_original_after_the_second_switch_is_cancelled(
    fleet, tick, hosts, domains, fake_clock
):
    tick()
    hosts.hosts["west"].sleep_fails = True  # the standby's demotion (the second leg) hangs
    drill = round_trip(fleet)
    tick()
    drive_to(drill, "back_demote_old_sleep", tick, fake_clock)
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == domains()["east"].id
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)

    tick()  # one tick

    drill.refresh_from_db()
    assert (drill.state, drill.error["code"]) == ("cancelled", "preempted")
    assert drill.error["step"] == "back_demote_old_sleep"
    failover = Operation.objects.get(reason="auto_failover")
    assert failover.target_domain_id == domains()["west"].id
    assert failover.started_at is not None
    # west was awake (its sleep kept failing): the failover moved routing, once.
    assert switches(fleet) == [
        ("east", "west", "drill"),
        ("west", "east", "drill"),
        ("east", "west", "promote"),
    ]
    # Its clean-up never sleeps west, which serves now; what it tries to restore is the lost east.
    assert {e.domain_id for e in events(drill, "operation.cleanup.sleep")} <= {domains()["east"].id}
    assert hosts.hosts["west"].effects["slept"] == 0
    assert not any(hosts.hosts["west"].models.values())
