"""Finding 13 with real processes: a demote stuck on a failing sleep must not hold back the
failover when the active's supervisor dies."""

from __future__ import annotations

import pytest

from fleets.models import Domain, Event, Fleet, Operation
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
