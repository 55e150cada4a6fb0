"""Moving an adapter name's route: one compare-and-swap with the route revision.

The adapter routes (fleets/core/adapter_route.py) are routing state like the pointer and the
splits: each write moves only where the revision is what the caller read, is announced to every
proxy (`revision_publish`), and leaves a `fleet.adapter.route` event. A rollback is one such
write (the candidate goes, the version stays), so it lands as fast as one UPDATE.

Unlike a domain split, an adapter route may move while a promotion is in flight: the versions
live on every domain alike, and a pointer move keeps them. What it refuses is a version the
registry does not hold for that name and base model.
"""

from __future__ import annotations

from django.db.models import F

from fleets.base import clock
from fleets.core.adapter_route import (
    AdapterRoute,
    AdapterRouteInvalid,
    adapter_routes_dump,
    adapter_routes_parse,
)
from fleets.core.adapters import AdapterVersionState
from fleets.models import AdapterVersion, Fleet, Id
from fleets.services.events import guarded_update
from fleets.services.route_publish import revision_publish


def _check_versions(fleet_id: Id, name: str, route: AdapterRoute) -> None:
    known = set(
        AdapterVersion.objects.filter(
            fleet_id=fleet_id,
            name=name,
            base_model=route.base,
            version__in=route.versions(),
            state=AdapterVersionState.REGISTERED.value,
        ).values_list("version", flat=True)
    )
    missing = sorted(set(route.versions()) - known)
    if missing:
        raise AdapterRouteInvalid(
            f"adapter {name!r} has no registered version {missing[0]} for {route.base!r}"
        )


def adapter_route_set(
    *,
    fleet_id: Id,
    name: str,
    route: AdapterRoute | None,
    expected_revision: int,
    actor: str,
    reason: str = "",
) -> int | None:
    """Set (or, with None, remove) adapter `name`'s route; return the new revision, or None
    if the CAS lost (the revision moved).

    Raises AdapterRouteInvalid, changing nothing, for a version the registry does not hold.
    """
    fleet = Fleet.objects.filter(pk=fleet_id, route_revision=expected_revision).first()
    if fleet is None:
        return None
    routes = adapter_routes_parse(fleet.adapter_routes)
    if route is None:
        if name not in routes:
            return expected_revision
        del routes[name]
    else:
        _check_versions(fleet_id, name, route)
        routes[name] = route
    revision = expected_revision + 1
    moved = guarded_update(
        Fleet.objects.filter(pk=fleet_id, route_revision=expected_revision),
        {
            "adapter_routes": adapter_routes_dump(routes),
            "route_revision": F("route_revision") + 1,
            "updated_at": clock.now(),
        },
        {
            "fleet_id": fleet_id,
            "kind": "fleet.adapter.route",
            "actor": actor,
            "data": {
                "adapter": name,
                "route": route.as_json() if route else None,
                "revision": revision,
                "reason": reason,
            },
        },
        then=lambda: revision_publish(str(fleet_id), revision),
    )
    return revision if moved else None
