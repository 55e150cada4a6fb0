"""Cross-model reads: fleet lookup by slug or UUID, the core's FleetView, API snapshots.

The JSON shapes themselves are rendered by `fleets/reads/shapes.py`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from fleets.base import clock
from fleets.base.errors import FleetNotFound, InvalidTarget, OperationNotFound
from fleets.core.backoff import Attempt, Backoff, failover_backoffs
from fleets.core.decisions import find_domain
from fleets.core.flapping import Damping, flap_damping
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView, SlotView
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, OperationKind, OperationState
from fleets.models import Domain, Fleet, Id, ModelBinding, Operation, Slot
from fleets.reads.shapes import fleet_json
from fleets.reads.sightings import overlaid, overlay, sightings_of


def _as_uuid(ref: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(ref))
    except (ValueError, AttributeError, TypeError):
        return None


def fleet_get(ref: str) -> Fleet:
    """Return the fleet whose UUID, then slug, is `ref` (UUID tried first)."""
    as_id = _as_uuid(ref)
    fleet = None
    if as_id is not None:
        fleet = Fleet.objects.filter(pk=as_id).first()
    if fleet is None and isinstance(ref, str):
        fleet = Fleet.objects.filter(slug=ref.strip().lower()).first()
    if fleet is None:
        raise FleetNotFound(f"fleet {ref!r} not found")
    return fleet


def domain_get(fleet: Fleet, ref: str) -> Domain:
    """Return the fleet's domain named by `ref` (id, else slug, resolved by the core's
    `find_domain` like every request's target); raise InvalidTarget if there is none."""
    found = find_domain(fleet_view(fleet), ref)
    if found is None:
        raise InvalidTarget(f"domain {ref!r} is not in fleet {fleet.slug!r}")
    return Domain.objects.get(pk=found.id)


def domain_or_active(fleet: Fleet, ref: str | None) -> Domain:
    """Return the domain `ref` names, or the fleet's active domain when `ref` is empty; raise
    InvalidTarget when neither exists (the baseline recording's "from what serves")."""
    if ref:
        return domain_get(fleet, ref)
    if fleet.active_domain_id is None:
        raise InvalidTarget("the fleet has no active domain; name a serving one (domainId)")
    return Domain.objects.get(pk=fleet.active_domain_id)


def fleet_view(fleet: Fleet | str, sightings: Mapping[str, datetime] | None = None) -> FleetView:
    """Build the pure core's view of one fleet from the database (five queries).

    Each domain's `last_seen_at` is the later of its row's and the sighting on the fleet's tick
    lease (`fleets.reads.sightings`): `sightings` when the caller holds them (a tick, from its
    lease), else read."""
    if not isinstance(fleet, Fleet):
        fleet = fleet_get(fleet)
    else:
        # The splits with the revision they were moved with (the route intent shows both).
        fleet.refresh_from_db(fields=["active_domain", "route_revision", "policy", "route_splits"])
    domains = list(Domain.objects.filter(fleet=fleet))
    if sightings is None:
        sightings = sightings_of([fleet.pk])
    overlay(domains, sightings)
    slots = list(Slot.objects.filter(domain__fleet=fleet))
    bindings = list(ModelBinding.objects.filter(domain__fleet=fleet))
    return view_of(fleet, domains, slots, bindings)


def view_of(
    fleet: Fleet, domains: Sequence[Any], slots: Sequence[Any], bindings: Sequence[Any]
) -> FleetView:
    """Build the core's view of `fleet` from its rows, already read (one fleet's, or more:
    the rows of other fleets' domains are ignored), so a list of fleets reads each table once
    (fleets/reads/fleet_list.py). Rows are model instances or anything with their attributes
    (the list's named tuples)."""
    domains = [d for d in domains if d.fleet_id == fleet.pk]
    own = {d.id for d in domains}
    slot_by_id = {s.id: s for s in slots if s.domain_id in own}
    views = []
    for d in domains:
        d_slots = tuple(
            SlotView(id=str(s.id), gpu_index=s.gpu_index, kind=s.kind, state=s.state)
            for s in slot_by_id.values()
            if s.domain_id == d.id
        )
        d_models = tuple(
            ModelView(
                name=b.name,
                serving_url=b.serving_url,
                slot_id=str(b.slot_id),
                gpu_index=slot_by_id[b.slot_id].gpu_index,
                slot_state=slot_by_id[b.slot_id].state,
                health=b.health,
                serving_seen_at=b.serving_seen_at,
            )
            for b in bindings
            if b.domain_id == d.id
        )
        views.append(
            DomainView(
                id=str(d.id),
                slug=d.slug,
                state=d.state,
                provider=d.provider,
                priority=d.priority,
                supervisor_url=d.supervisor_url or None,
                serving_base_url=d.serving_base_url or None,
                last_seen_at=d.last_seen_at,
                slots=d_slots,
                models=d_models,
                state_since=d.state_updated_at,
            )
        )
    return FleetView(
        id=str(fleet.id),
        slug=fleet.slug,
        active_domain_id=str(fleet.active_domain_id) if fleet.active_domain_id else None,
        route_revision=fleet.route_revision,
        policy=Policy.resolve(fleet.policy),
        domains=tuple(views),
    )


def operation_in_flight(fleet_id: Id) -> Operation | None:
    """Return the fleet's pending or running operation, if any (served by the partial index)."""
    return (
        Operation.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES)
        .select_related("target_domain", "source_domain")
        .first()
    )


def operation_get(ref: str) -> Operation:
    as_id = _as_uuid(ref)
    op = (
        Operation.objects.filter(pk=as_id)
        .select_related("fleet", "target_domain", "source_domain")
        .first()
        if as_id
        else None
    )
    if op is None:
        raise OperationNotFound(f"operation {ref!r} not found")
    return op


# The reason of a promotion the reconciler requested on its own (fleets.reconciler.tick).
AUTO_FAILOVER = "auto_failover"
# How many recent promotions the backoff looks back over: more failures in a row than this
# cannot change a delay that doubled to its cap long before.
_BACKOFF_LOOKBACK = 32


def failover_backoff_state(fleet_id: Id, policy: Policy) -> dict[str, Backoff]:
    """Return each standby's backoff after failed automatic promotions (fleets.core.backoff).

    Automatic attempts that failed or were cancelled count; a succeeded promotion, automatic or
    an operator's, ends the episode. An operator's failed promotion does not count: backoff
    guards against the reconciler repeating itself, not against an operator.
    """
    rows = (
        Operation.objects.filter(fleet_id=fleet_id, kind=OperationKind.PROMOTE)
        .order_by("-created_at")
        .values_list("target_domain_id", "state", "finished_at", "reason")[:_BACKOFF_LOOKBACK]
    )
    attempts = [
        Attempt(str(target), state, finished_at)
        for target, state, finished_at, reason in rows
        if target is not None and (reason == AUTO_FAILOVER or state == OperationState.SUCCEEDED)
    ]
    return failover_backoffs(attempts, policy)


def failover_commits(fleet_id: Id, policy: Policy, now: datetime) -> list[datetime]:
    """Return when the fleet's automatic failovers within `flapWindowMs` committed routing.

    Their `served_at`, the pointer's compare-and-swap. An operator's promotion never counts:
    damping guards against the reconciler chasing a flapping host, not against an operator.
    """
    since = now - timedelta(milliseconds=policy.flap_window_ms)
    committed = Operation.objects.filter(
        fleet_id=fleet_id,
        kind=OperationKind.PROMOTE,
        reason=AUTO_FAILOVER,
        routing_committed=True,
        served_at__gte=since,
    ).values_list("served_at", flat=True)
    return [at for at in committed if at is not None]


def failover_damping_state(fleet_id: Id, policy: Policy, now: datetime) -> Damping | None:
    """Return the fleet's flap damping (fleets.core.flapping), or None."""
    return flap_damping(failover_commits(fleet_id, policy, now), policy, now)


def fleet_snapshot(fleet: Fleet) -> dict[str, Any]:
    """Return the full public snapshot of a fleet as it is now (rendered by `shapes.fleet_json`)."""
    fleet.refresh_from_db()
    policy = Policy.resolve(fleet.policy)
    return fleet_json(
        fleet,
        domains=overlaid(list(Domain.objects.filter(fleet=fleet)), [fleet.pk]),
        slots=Slot.objects.filter(domain__fleet=fleet),
        bindings=ModelBinding.objects.filter(domain__fleet=fleet),
        operation=operation_in_flight(fleet.id),
        backoffs=failover_backoff_state(fleet.id, policy),
        damping=failover_damping_state(fleet.id, policy, clock.now()),
    )
