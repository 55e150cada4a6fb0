"""`guarded_update`: the compare-and-swap and the events it owes, in one transaction."""

from __future__ import annotations

import pytest

from fleets.models import Domain, Event
from fleets.services.events import guarded_update

pytestmark = pytest.mark.django_db


def _event(fleet, domain, kind: str) -> dict:
    return {"fleet_id": fleet.id, "domain_id": domain.id, "kind": kind, "actor": "test"}


def test_a_guard_that_matches_writes_the_row_its_events_and_runs_then(seeded_fleet):
    west = seeded_fleet.domains.get(slug="west")
    ran = []
    moved = guarded_update(
        Domain.objects.filter(pk=west.id, state=west.state),
        {"state": "degraded"},
        _event(seeded_fleet, west, "test.first"),
        _event(seeded_fleet, west, "test.second"),
        then=lambda: ran.append(True),
    )
    assert moved == 1
    assert Domain.objects.get(pk=west.id).state == "degraded"
    kinds = list(
        Event.objects.filter(kind__startswith="test.").order_by("id").values_list("kind", flat=True)
    )
    assert kinds == ["test.first", "test.second"]
    assert ran == [True]


def test_a_guard_that_misses_writes_no_event_and_skips_then(seeded_fleet):
    west = seeded_fleet.domains.get(slug="west")
    before = Event.objects.count()
    ran = []
    moved = guarded_update(
        Domain.objects.filter(pk=west.id, state="stopped"),  # not what it is: someone moved it
        {"state": "degraded"},
        _event(seeded_fleet, west, "test.never"),
        then=lambda: ran.append(True),
    )
    assert moved == 0
    assert Domain.objects.get(pk=west.id).state == west.state
    assert Event.objects.count() == before
    assert ran == []


def test_a_failure_after_the_update_rolls_the_update_and_its_events_back(seeded_fleet):
    west = seeded_fleet.domains.get(slug="west")
    before = Event.objects.count()

    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        guarded_update(
            Domain.objects.filter(pk=west.id, state=west.state),
            {"state": "degraded"},
            _event(seeded_fleet, west, "test.rolled_back"),
            then=fails,
        )
    assert Domain.objects.get(pk=west.id).state == west.state
    assert Event.objects.count() == before
