"""Pin an adapter's route to one version (or take the pin off): an operator's hold.

A pin is one `adapter_route_set` compare-and-swap: the route names the version, `pinned` is
set, and automatic adapter rollouts (fleets/reconciler/adapter_rollout.py) leave the route
alone until it is unpinned. Refused while an adapter rollout of that name is in flight (its
abort restores the route first), for a version the registry does not hold, and for one whose
copy on the active is not probed (users would be routed to nothing).
"""

from __future__ import annotations

from typing import Any

from fleets.base.errors import (
    AdapterNotFound,
    InvalidRequest,
    InvalidTarget,
    RolloutConflict,
)
from fleets.core.adapter_rollout import ADAPTER_KIND
from fleets.core.adapter_route import AdapterRoute, AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import AdapterVersionState, CopyState
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.models import AdapterCopy, AdapterVersion, Fleet, Id, Rollout
from fleets.services.adapter_routes import adapter_route_set

# A lost CAS (the route revision moved: another route, a split, the pointer) is retried.
ATTEMPTS = 3


def _version_from(body: Any) -> int:
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be {"version": N}', field="version")
    unknown = sorted(set(body) - {"version"})
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: is not a known field", field=unknown[0])
    number = body.get("version")
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 10**9:
        raise InvalidRequest("version: must be a version number from 1", field="version")
    return number


def _refuse_in_flight(fleet_id: Id, name: str) -> None:
    current = Rollout.objects.filter(
        fleet_id=fleet_id,
        model=name,
        candidate__kind=ADAPTER_KIND,
        state__in=IN_FLIGHT_ROLLOUT_STATES,
    ).first()
    if current is not None:
        raise RolloutConflict(
            f"adapter rollout {current.id} of {name!r} is in flight ({current.state}): abort it "
            "before pinning"
        )


def _route(fleet_id: Id, name: str) -> tuple[int, AdapterRoute]:
    row = Fleet.objects.filter(pk=fleet_id).values("route_revision", "adapter_routes").first()
    if row is None:
        raise AdapterNotFound("the fleet is gone")
    try:
        route = adapter_routes_parse(row["adapter_routes"]).get(name)
    except AdapterRouteInvalid as exc:
        raise InvalidTarget(f"the fleet's adapter routes are unreadable: {exc}") from None
    if route is None:
        raise AdapterNotFound(f"adapter {name[:100]!r} has no route in this fleet")
    return row["route_revision"], route


def _write(fleet_id: Id, name: str, make: Any, actor: str, reason: str) -> AdapterRoute:
    for _ in range(ATTEMPTS):
        revision, route = _route(fleet_id, name)
        wanted = make(route)
        try:
            moved = adapter_route_set(
                fleet_id=fleet_id,
                name=name,
                route=wanted,
                expected_revision=revision,
                actor=actor,
                reason=reason,
            )
        except AdapterRouteInvalid as exc:
            raise InvalidTarget(str(exc)) from None
        if moved is not None:
            return wanted  # type: ignore[no-any-return]
    raise RolloutConflict("the fleet's routes kept moving while pinning; retry")


def adapter_pin(*, fleet: Fleet, name: str, body: Any, actor: str) -> AdapterRoute:
    """Route adapter `name` to version N, pinned; return the route as written.

    Raises, changing nothing: InvalidRequest (400) for a body at fault; AdapterNotFound (404)
    for a name without a route or an unknown version; RolloutConflict (409) while an adapter
    rollout of `name` is in flight; InvalidTarget (422) for a version not registered, of another
    base model, or not probed on the active.
    """
    number = _version_from(body)
    _revision, route = _route(fleet.id, name)
    version = AdapterVersion.objects.filter(fleet_id=fleet.id, name=name, version=number).first()
    if version is None:
        raise AdapterNotFound(f"adapter {name!r} has no version {number} in this fleet")
    _refuse_in_flight(fleet.id, name)
    if version.state != AdapterVersionState.REGISTERED or version.base_model != route.base:
        raise InvalidTarget(
            f"{name}@v{number} cannot serve this route ({version.state}, trained for "
            f"{version.base_model!r}, the route serves {route.base!r})"
        )
    active = Fleet.objects.filter(pk=fleet.id).values_list("active_domain_id", flat=True).first()
    probed = active is not None and (
        AdapterCopy.objects.filter(
            adapter=version, domain_id=active, state=CopyState.PROBED.value
        ).exists()
    )
    if not probed:
        raise InvalidTarget(
            f"{name}@v{number} is not probed on the active domain: nothing could answer for it"
        )

    def pinned(current: AdapterRoute) -> AdapterRoute:
        return AdapterRoute(
            base=current.base, version=number, sticky_header=current.sticky_header, pinned=True
        )

    return _write(fleet.id, name, pinned, actor, f"pinned to v{number} by {actor}")


def adapter_unpin(*, fleet: Fleet, name: str, actor: str) -> AdapterRoute:
    """Take the pin off adapter `name`'s route (its version stays); automatic rollouts may move
    it again. AdapterNotFound (404) for a name without a route."""
    _revision, route = _route(fleet.id, name)
    if not route.pinned:
        return route

    def unpinned(current: AdapterRoute) -> AdapterRoute:
        return AdapterRoute(
            base=current.base,
            version=current.version,
            candidate=current.candidate,
            weight_permille=current.weight_permille,
            rollout_id=current.rollout_id,
            sticky_header=current.sticky_header,
            pinned=False,
        )

    return _write(fleet.id, name, unpinned, actor, f"unpinned by {actor}")
