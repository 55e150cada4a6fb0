"""What the per-fleet access tests share: a second fleet beside the seeded `demo`, and a clean
slate for the denial audit's flood bound (kept in Django's cache)."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from fleets.layouts.loader import parse_layout
from fleets.models import Event, Fleet
from fleets.services.access import ACCESS_DENIED
from fleets.services.layouts import layout_apply

OTHER = "other"


@pytest.fixture
def other_fleet(seeded_fleet, layout_data) -> Fleet:
    """A second fleet (`other`, domains east and west) next to `demo`."""
    layout_apply(layout=parse_layout({**layout_data, "slug": OTHER, "displayName": "Other"}))
    return Fleet.objects.get(slug=OTHER)


@pytest.fixture
def denials_forgotten():
    """Start with no denial window open: one left by an earlier test would fold an event."""
    cache.clear()
    yield
    cache.clear()


def denials(fleet: Fleet) -> list[Event]:
    """The fleet's access.denied events, oldest first."""
    return list(Event.objects.filter(fleet=fleet, kind=ACCESS_DENIED).order_by("id"))
