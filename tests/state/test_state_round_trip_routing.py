"""The routing pointer under a round-trip drill: its switches move it there and back without
committing routing, and a failed drill's clean-up routes back by one guarded UPDATE."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.models import Domain, Event, Fleet, Operation
from fleets.services.route_pointer import route_switch, route_switch_back

pytestmark = pytest.mark.django_db


def _drill(fleet, *, state="running", mode="round_trip", cleanup="") -> Operation:
    east = Domain.objects.get(fleet=fleet, slug="east")
    west = Domain.objects.get(fleet=fleet, slug="west")
    return Operation.objects.create(
        fleet=fleet,
        kind="drill",
        drill_mode=mode,
        state=state,
        cleanup=cleanup,
        target_domain=west,
        target_domain_slug="west",
        source_domain=east,
        created_at=clock.now(),
    )


def _ids(fleet):
    return (
        Domain.objects.get(fleet=fleet, slug="east").id,
        Domain.objects.get(fleet=fleet, slug="west").id,
    )


def test_a_round_trip_moves_routing_there_and_back_without_committing(seeded_fleet):
    east, west = _ids(seeded_fleet)
    op = _drill(seeded_fleet)
    there = route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=op.id,
        target_domain_id=west,
        expected_active_id=east,
        expected_revision=1,
    )
    back = route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=op.id,
        target_domain_id=east,
        expected_active_id=west,
        expected_revision=2,
    )
    assert (there, back) == (2, 3)
    fleet = Fleet.objects.get(pk=seeded_fleet.pk)
    assert fleet.active_domain_id == east and fleet.route_revision == 3
    op.refresh_from_db()
    assert op.routing_committed is False  # its clean-up must stay free to route back


def test_a_check_drill_can_never_move_routing(seeded_fleet):
    east, west = _ids(seeded_fleet)
    op = _drill(seeded_fleet, mode="check")
    moved = route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=op.id,
        target_domain_id=west,
        expected_active_id=east,
        expected_revision=1,
    )
    assert moved is None
    assert Fleet.objects.get(pk=seeded_fleet.pk).route_revision == 1


def _on_west(fleet) -> None:
    _, west = _ids(fleet)
    Fleet.objects.filter(pk=fleet.pk).update(active_domain_id=west, route_revision=2)


def _back(fleet, op, revision=2):
    east, west = _ids(fleet)
    return route_switch_back(
        fleet_id=fleet.id,
        operation_id=op.id,
        from_domain_id=west,
        to_domain_id=east,
        expected_revision=revision,
    )


def test_a_failed_round_trip_routes_back_once(seeded_fleet):
    _on_west(seeded_fleet)
    op = _drill(seeded_fleet, state="failed", cleanup="pending")
    assert _back(seeded_fleet, op) == 3
    assert _back(seeded_fleet, op, revision=3) is None  # the pointer is not on west any more
    fleet = Fleet.objects.get(pk=seeded_fleet.pk)
    assert fleet.active_domain.slug == "east" and fleet.route_revision == 3
    event = Event.objects.get(operation=op, kind="fleet.route.switched")
    assert event.data["reason"] == "drill_failed_route_back" and event.data["revision"] == 3


@pytest.mark.parametrize(
    "drill",
    [
        {"state": "running", "cleanup": ""},  # still running: its own steps move routing
        {"state": "failed", "cleanup": "done"},  # clean-up over: a later move is never undone
        {"state": "failed", "cleanup": "pending", "mode": "check"},
    ],
    ids=["running", "cleanup-done", "check-drill"],
)
def test_route_back_is_refused_unless_a_failed_round_trip_still_owns_its_clean_up(
    seeded_fleet, drill
):
    _on_west(seeded_fleet)
    op = _drill(seeded_fleet, **drill)
    assert _back(seeded_fleet, op) is None
    assert Fleet.objects.get(pk=seeded_fleet.pk).active_domain.slug == "west"


def test_route_back_loses_to_a_pointer_that_moved_meanwhile(seeded_fleet):
    _on_west(seeded_fleet)
    op = _drill(seeded_fleet, state="failed", cleanup="pending")
    assert _back(seeded_fleet, op, revision=1) is None
    assert Fleet.objects.get(pk=seeded_fleet.pk).route_revision == 2


@pytest.mark.parametrize(("kind", "refused"), [("promote", True), ("demote", False)])
def test_route_back_leaves_the_pointer_to_a_promotion_in_flight(seeded_fleet, kind, refused):
    # A failover that pre-empted the drill (its standby was lost) owns routing: a route-back
    # beside it would move the pointer twice for one outage. A demote never moves it.
    _on_west(seeded_fleet)
    op = _drill(seeded_fleet, state="cancelled", cleanup="pending")
    east, west = _ids(seeded_fleet)
    Operation.objects.create(
        fleet=seeded_fleet,
        kind=kind,
        state="running",
        target_domain_id=east if kind == "promote" else west,
        source_domain_id=west,
        reason="auto_failover",
        created_at=clock.now(),
    )
    assert (_back(seeded_fleet, op) is None) is refused
    fleet = Fleet.objects.get(pk=seeded_fleet.pk)
    assert fleet.active_domain.slug == ("west" if refused else "east")
