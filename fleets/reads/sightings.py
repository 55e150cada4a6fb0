"""Heartbeat sightings kept on the fleet's tick lease: when a healthy host was last heard.

A good heartbeat that changed nothing writes no domain row (`fleets.core.heartbeat_cadence`):
the tick that heard it keeps the sighting in memory and writes it with the statement that gives
its lease back (`Lease.sightings`, domain id -> ISO time), a row the tick writes anyway. A
domain's last good heartbeat is therefore the later of its row's `last_seen_at` (written by a
beat that moved something, failed, recovered, or by a tick without a lease) and the sighting on
its fleet's tick lease. Every freshness reader (the tick's snapshot, `fleet_view`, the API, the
fleet page and the overview, the metrics) reads both through this module: `overlay` puts the
later one in `last_seen_at` of the rows it was given, in memory.

A worker that dies mid-tick gives nothing back: the lease keeps the sightings of the last tick
that did, and the next holder (one lease later at most) adds its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from fleets.models import Id, Lease

# The tick lease's name, defined here for its readers and for the reconciler that takes it
# (`fleets.reconciler.locks` imports it: reads may not import the reconciler).
TICK_LEASE_PREFIX = "tick:"

# Domain id (str) -> when it was last heard good without its row being written.
Sightings = dict[str, datetime]


def tick_lease_name(fleet_id: Id) -> str:
    return f"{TICK_LEASE_PREFIX}{fleet_id}"


def decode(raw: Any) -> Sightings:
    """The sightings as stored (a JSON object, or its text from a raw statement); anything
    unreadable is left out."""
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    if not isinstance(raw, dict):
        return {}
    out: Sightings = {}
    for key, value in raw.items():
        at = parse_datetime(value) if isinstance(value, str) else None
        if at is None:
            continue
        out[str(key)] = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return out


def encode(sightings: Mapping[str, datetime]) -> dict[str, str]:
    return {key: at.astimezone(UTC).isoformat() for key, at in sightings.items()}


def note(sightings: Sightings, domain_id: Id, seen_at: datetime) -> None:
    """Keep `seen_at` as the domain's sighting unless a later one is already kept."""
    key = str(domain_id)
    held = sightings.get(key)
    if held is None or held < seen_at:
        sightings[key] = seen_at


def later(stored: datetime | None, sighting: datetime | None) -> datetime | None:
    """The later of a row's `last_seen_at` and the lease's sighting (None if neither)."""
    if stored is None:
        return sighting
    if sighting is None:
        return stored
    return max(stored, sighting)


def sightings_of(fleet_ids: Iterable[Id]) -> Sightings:
    """The sightings on the tick leases of `fleet_ids` (one query), domain ids being unique."""
    names = [tick_lease_name(f) for f in fleet_ids]
    out: Sightings = {}
    if not names:
        return out
    for raw in Lease.objects.filter(name__in=names).values_list("sightings", flat=True):
        out.update(decode(raw))
    return out


def overlay(domains: Sequence[Any], sightings: Mapping[str, datetime]) -> list[Any]:
    """The domain rows with `last_seen_at` the later of theirs and the lease's sighting.

    Model instances are changed in place (and returned); the list reads' named tuples are
    replaced by copies. Rows without a sighting are returned as they are."""
    out = []
    for d in domains:
        sighting = sightings.get(str(d.id))
        seen = later(d.last_seen_at, sighting)
        if sighting is None or seen == d.last_seen_at:
            out.append(d)
        elif hasattr(d, "_replace"):
            out.append(d._replace(last_seen_at=seen))
        else:
            d.last_seen_at = seen
            out.append(d)
    return out


def overlaid(domains: Sequence[Any], fleet_ids: Iterable[Id]) -> list[Any]:
    """`overlay` with the sightings read from the fleets' tick leases (one query)."""
    return overlay(domains, sightings_of(fleet_ids))
