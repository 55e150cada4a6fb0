"""Finding 13 with real processes: a demote stuck on a failing sleep must not hold back the
failover when the active's supervisor dies, and neither must a promotion's best-effort steps on
the old active once the domain it routed to crashes."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.models import Domain, Event, Fleet, Operation
from fleets.reconciler.steps.base import switch_settle_ms
from fleets.services.operations import operation_request

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_a_demote_stuck_on_a_failing_sleep_is_preempted_by_the_failover(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    # A long sleep budget: without pre-emption the demote would block failover for a minute.
    fleet = make_fleet(east, west, {"sleepTimeoutMs": 60_000})
    drive(fleet, lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)))
    west.post("/v1/vllm/wake")  # awake by mistake, and its engines refuse to sleep
    for model in west.model_ports:
        west.fault(model, sleepFails=True)
    demote = operation_request(
        fleet=fleet, kind="demote", target_domain_id=Domain.objects.get(slug="west").id
    ).operation
    ticks = iter(range(3))

    def stuck() -> bool:
        demote.refresh_from_db()
        return demote.current_step == "sleep" and next(ticks, None) is None

    drive(fleet, stuck)  # three ticks in, the sleep still has not happened
    assert demote.state == "running"
    assert set(west.asleep().values()) == {False}

    east.crash()
    failover = drive(
        fleet,
        lambda: Operation.objects.filter(fleet=fleet, reason="auto_failover").first(),
        timeout=15,
    )

    demote.refresh_from_db()
    assert (demote.state, demote.error["code"]) == ("cancelled", "preempted")
    cancelled = Event.objects.get(operation=demote, kind="operation.cancelled")
    # The same tick: detected, pre-empted, then the promotion requested.
    assert failover.detected_at <= cancelled.created_at <= failover.created_at
    assert failover.target_domain.slug == "west"
    # Routing moves; the best-effort sleep of the dead east then waits out its (long) budget.
    done = drive(
        fleet,
        lambda: Operation.objects.filter(pk=failover.pk, routing_committed=True).first(),
        timeout=30,
    )
    assert done.state == "running" and done.current_step == "demote_old_sleep"
    assert Fleet.objects.get(pk=fleet.pk).active_domain.slug == "west"


def test_a_committed_promotion_stuck_on_the_old_actives_sleep_yields_when_its_new_active_crashes(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    # The default budgets: without pre-emption the failover would wait out east's failing
    # sleep (60 s), and a proven sleep would add the training restart's (30 s).
    fleet = make_fleet(east, west, {"sleepTimeoutMs": 60_000, "startTrainingTimeoutMs": 30_000})
    drive(fleet, lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)))
    for model in east.model_ports:
        east.fault(model, sleepFails=True)  # the old active's engines refuse to sleep
    promotion = operation_request(
        fleet=fleet, kind="promote", target_domain_id=Domain.objects.get(slug="west").id
    ).operation

    settle_s = switch_settle_ms() / 1000

    def stuck_on_east() -> bool:
        promotion.refresh_from_db()
        # Past the proxies' settle time, so the sleep itself has been asked for, and refused.
        since = promotion.step_started_at
        return (
            promotion.current_step == "demote_old_sleep"
            and since is not None
            and (clock.now() - since).total_seconds() > settle_s + 1
        )

    drive(fleet, stuck_on_east, timeout=20)
    assert promotion.routing_committed and promotion.state == "running"
    assert Fleet.objects.get(pk=fleet.pk).active_domain.slug == "west"
    assert set(east.asleep().values()) == {False}
    revision = Fleet.objects.get(pk=fleet.pk).route_revision

    crashed_at = clock.now()
    west.crash()
    failover = drive(
        fleet,
        lambda: Operation.objects.filter(fleet=fleet, reason="auto_failover").first(),
        timeout=20,  # a third of the sleep budget the promotion would otherwise wait out
    )

    promotion.refresh_from_db()
    assert promotion.state == "succeeded" and promotion.error is None
    skipped = Event.objects.filter(operation=promotion, kind="operation.step.skipped")
    assert [(e.step, e.data["reason"]) for e in skipped.order_by("id")] == [
        ("demote_old_sleep", "preempted"),
        ("demote_old_train", "preempted"),
    ]
    ended = Event.objects.get(operation=promotion, kind="operation.succeeded")
    # The same tick: the promotion ended, then the failover was requested.
    assert failover.detected_at <= ended.created_at <= failover.created_at
    assert failover.target_domain.slug == "east"
    moved = drive(
        fleet,
        lambda: Event.objects.filter(operation=failover, kind="fleet.route.switched").first(),
        timeout=20,
    )
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "east" and fleet.route_revision == revision + 1
    assert set(east.asleep().values()) == {False}  # never put to sleep under the failover
    requested_s = (failover.created_at - crashed_at).total_seconds()
    moved_s = (moved.created_at - crashed_at).total_seconds()
    print(
        f"\nFIGURE f13 committed promotion stuck on the old active's sleep (sleepTimeoutMs "
        f"60000): new active crashed -> failover requested {requested_s:.2f} s, "
        f"-> routing moved {moved_s:.2f} s"
    )
