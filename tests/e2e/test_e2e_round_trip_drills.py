"""Round-trip drills end to end on real supervisors and simulated engines: the standby is
promoted and the original active promoted back (routing moves twice, each by the one CAS), and
a failure anywhere leaves the fleet no worse than it started."""

from __future__ import annotations

import pytest

from fleets.core.states import ROUND_TRIP_DRILL_STEPS
from fleets.models import Event, Fleet, Operation
from fleets.reads.recovery import recovery_report
from fleets.services.operations import operation_request
from tests.e2e.test_e2e_failover import assert_nothing_in_flight, finished, seen

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _round_trip(fleet) -> Operation:
    result = operation_request(
        fleet=fleet, kind="drill", target_domain_id=None, actor="test", drill_mode="round_trip"
    )
    assert result.operation is not None
    return result.operation


def _switches(fleet) -> list[tuple[str, str]]:
    names = {str(d.id): d.slug for d in fleet.domains.all()}
    return [
        (names[e.data["fromDomainId"]], names[e.data["toDomainId"]])
        for e in Event.objects.filter(fleet=fleet, kind="fleet.route.switched").order_by("id")
    ]


def test_a_round_trip_drill_moves_routing_there_and_back_and_times_both_legs(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))

    op = drive(fleet, finished(_round_trip(fleet)), timeout=40)

    assert op.state == "succeeded", op.error
    assert op.drill_mode == "round_trip" and op.target_slug == "west"
    steps = {
        e.step: e.duration_ms
        for e in Event.objects.filter(operation=op, kind="operation.step.done")
    }
    assert set(steps) == set(ROUND_TRIP_DRILL_STEPS)
    assert all(isinstance(ms, int) and ms >= 0 for ms in steps.values())
    # Twice, each by the switch step's CAS: to the standby, then back.
    assert _switches(fleet) == [("east", "west"), ("west", "east")]
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "east" and fleet.route_revision == 3
    assert not op.routing_committed  # a drill never commits: its clean-up may route back
    assert_nothing_in_flight(fleet)
    # Each side proved its demotion: west back in standby posture, east serving again.
    drive(fleet, lambda: west.trainer()["state"] == "running")
    assert set(west.asleep().values()) == {True}
    assert set(east.asleep().values()) == {False}
    # The drill's sample counts its first switch, and has no detection.
    (sample,) = recovery_report(fleet)["samples"]
    assert sample["kind"] == "drill" and sample["detection"] == "none"
    assert sample["detectionMs"] == 0 and "switch_route" in sample["stepsMs"]


def test_a_round_trip_whose_original_cannot_come_back_stays_on_the_standby(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    # Baselines from what serves (the tick's pass), then east answers differently after its
    # next wake: the drill's second leg.
    drive(fleet, lambda: Event.objects.filter(kind="golden.baseline.recorded").count() == 2)
    east.fault("llama-small", answerDriftsAfterWake=True)

    op = drive(fleet, finished(_round_trip(fleet)), timeout=40)

    assert op.state == "failed"
    assert op.error["step"] == "back_probe" and op.error["code"] == "probe_mismatch"
    assert Event.objects.filter(operation=op, kind="drill.failed").exists()
    drive(fleet, lambda: Operation.objects.get(pk=op.pk).cleanup == "done", timeout=30)
    # East never proved it serves again: routing stays on west, which passed its own probe.
    back = Event.objects.get(operation=op, kind="operation.cleanup.route_back")
    assert back.data["ok"] is False and "routing stays on west" in back.data["message"]
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "west"
    assert _switches(fleet) == [("east", "west")]
    assert "back_switch_route" not in Event.objects.filter(operation=op).values_list(
        "step", flat=True
    )
    # East, which could not come back, is put in standby posture instead.
    assert set(east.asleep().values()) == {True}
    assert east.trainer()["state"] == "running"
    assert set(west.asleep().values()) == {False}
    assert_nothing_in_flight(fleet)


def test_a_round_trip_that_cannot_demote_the_original_routes_back_to_it(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west, {"sleepTimeoutMs": 1000})
    drive(fleet, seen(fleet))
    # Neither of east's models will sleep: east keeps serving while the drill cannot demote it.
    east.fault("qwen-small", sleepFails=True)
    east.fault("llama-small", sleepFails=True)

    op = drive(fleet, finished(_round_trip(fleet)), timeout=40)

    assert op.state == "failed"
    assert op.error["step"] == "demote_old_sleep" and op.error["code"] == "step_timeout"
    drive(fleet, lambda: Operation.objects.get(pk=op.pk).cleanup == "done", timeout=30)
    # East still serves (awake, reproduces its baseline): traffic goes back to it.
    back = Event.objects.get(operation=op, kind="operation.cleanup.route_back")
    assert back.data["ok"] is True
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "east" and fleet.route_revision == 3
    assert _switches(fleet) == [("east", "west"), ("west", "east")]
    # And the standby is back in posture.
    assert set(west.asleep().values()) == {True}
    assert west.trainer()["state"] == "running"
    assert_nothing_in_flight(fleet)


def test_a_round_trip_drill_is_refused_while_automatic_failover_is_off(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west, {"autoFailover": False})
    drive(fleet, seen(fleet))
    Fleet.objects.filter(pk=fleet.pk).update(drill_interval_minutes=1, drill_mode="round_trip")

    drive(fleet, lambda: True)

    # The schedule asks every tick; the refusal leaves nothing behind and routing where it was.
    assert not Operation.objects.filter(fleet=fleet).exists()
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "east" and fleet.route_revision == 1
