"""Moving a model's split: a compare-and-swap with the route revision (services/route_splits)."""

from __future__ import annotations

import uuid

import pytest

from fleets.core.route_split import Split, SplitInvalid, splits_parse
from fleets.models import Domain, Event, Fleet
from fleets.services.operations import operation_request, operation_start
from fleets.services.route_pointer import route_switch
from fleets.services.route_splits import route_split_set


def dom(fleet: Fleet, slug: str) -> Domain:
    return Domain.objects.get(fleet=fleet, slug=slug)


def split_to(domain: Domain, weight: int = 50) -> Split:
    return Split(str(uuid.uuid4()), str(domain.id), weight)


def test_a_split_moves_with_the_revision_and_is_recorded(seeded_fleet):
    split = split_to(dom(seeded_fleet, "west"))
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id,
            model="llama-small",
            split=split,
            expected_revision=1,
            actor="rollout",
        )
        == 2
    )
    seeded_fleet.refresh_from_db()
    assert seeded_fleet.route_revision == 2
    assert splits_parse(seeded_fleet.route_splits) == {"llama-small": split}
    event = Event.objects.get(kind="fleet.route.split")
    assert event.data["revision"] == 2 and event.data["split"]["weightPermille"] == 50
    # The same read again: the revision moved, nothing changes.
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id,
            model="llama-small",
            split=None,
            expected_revision=1,
            actor="rollout",
        )
        is None
    )
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id,
            model="llama-small",
            split=None,
            expected_revision=2,
            actor="rollout",
        )
        == 3
    )
    seeded_fleet.refresh_from_db()
    assert seeded_fleet.route_splits == {}


def test_the_active_cannot_be_its_own_candidate_and_a_stranger_is_refused(seeded_fleet):
    east = dom(seeded_fleet, "east")
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id,
            model="m",
            split=split_to(east),
            expected_revision=1,
            actor="t",
        )
        is None
    )
    stranger = Split(str(uuid.uuid4()), str(uuid.uuid4()), 10)
    with pytest.raises(SplitInvalid, match="not in this fleet"):
        route_split_set(
            fleet_id=seeded_fleet.id, model="m", split=stranger, expected_revision=1, actor="t"
        )
    seeded_fleet.refresh_from_db()
    assert (seeded_fleet.route_revision, seeded_fleet.route_splits) == (1, {})


def test_no_split_moves_beside_a_promotion_and_the_pointer_move_clears_splits(seeded_fleet):
    west = dom(seeded_fleet, "west")
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id,
            model="m",
            split=split_to(west),
            expected_revision=1,
            actor="t",
        )
        == 2
    )
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    assert operation_start(operation_id=op.id)
    assert (
        route_split_set(
            fleet_id=seeded_fleet.id, model="m", split=None, expected_revision=2, actor="t"
        )
        is None
    )
    assert (
        route_switch(
            fleet_id=seeded_fleet.id,
            operation_id=op.id,
            target_domain_id=west.id,
            expected_active_id=dom(seeded_fleet, "east").id,
            expected_revision=2,
        )
        == 3
    )
    seeded_fleet.refresh_from_db()
    assert (seeded_fleet.active_domain_id, seeded_fleet.route_splits) == (west.id, {})
