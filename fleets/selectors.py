"""Cross-model reads: fleet lookup by slug or UUID, the core's FleetView, API snapshots."""

from __future__ import annotations

import uuid
from typing import Any

from fleets.clock import iso
from fleets.core.decisions import find_domain
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView, SlotView
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, SlotKind
from fleets.errors import FleetNotFound, InvalidTarget, OperationNotFound
from fleets.models import Domain, Fleet, Id, ModelBinding, Operation, Slot


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


def fleet_view(fleet: Fleet | str) -> FleetView:
    """Build the pure core's view of one fleet from the database (four queries)."""
    if not isinstance(fleet, Fleet):
        fleet = fleet_get(fleet)
    else:
        fleet.refresh_from_db(fields=["active_domain", "route_revision", "policy"])
    domains = list(Domain.objects.filter(fleet=fleet))
    slots = list(Slot.objects.filter(domain__fleet=fleet))
    bindings = list(ModelBinding.objects.filter(domain__fleet=fleet))
    slot_by_id = {s.id: s for s in slots}
    views = []
    for d in domains:
        d_slots = tuple(
            SlotView(id=str(s.id), gpu_index=s.gpu_index, kind=s.kind, state=s.state)
            for s in slots
            if s.domain_id == d.id
        )
        d_models = tuple(
            ModelView(
                name=b.name,
                serving_url=b.serving_url,
                slot_id=str(b.slot_id),
                gpu_index=slot_by_id[b.slot_id].gpu_index,
                slot_state=slot_by_id[b.slot_id].state,
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


def operation_json(op: Operation | None) -> dict[str, Any] | None:
    """Render an operation in the public camelCase contract."""
    if op is None:
        return None
    return {
        "id": str(op.id),
        "fleetId": str(op.fleet_id),
        "kind": op.kind,
        "state": op.state,
        "targetDomainId": str(op.target_domain_id) if op.target_domain_id else None,
        "targetDomainSlug": op.target_domain_slug or None,
        "sourceDomainId": str(op.source_domain_id) if op.source_domain_id else None,
        "currentStep": op.current_step or None,
        "stepStartedAt": iso(op.step_started_at),
        "routingCommitted": op.routing_committed,
        "error": op.error,
        "reason": op.reason,
        "requestedBy": op.requested_by,
        "createdAt": iso(op.created_at),
        "startedAt": iso(op.started_at),
        "finishedAt": iso(op.finished_at),
    }


# The driver_status keys operators see (phase, where it runs or was tried, the last error).
_PROVISIONING_KEYS = (
    "phase",
    "where",
    "cluster",
    "launches",
    "startedAt",
    "launchedAt",
    "upAt",
    "nextAttemptAt",
    "reason",
    "lastError",
)


def domain_provisioning_json(domain: Domain) -> dict[str, Any] | None:
    """Return where a provisioned domain's provisioning stands, or None for any other."""
    if not domain.driver:
        return None
    status = domain.driver_status or {}
    return {"managed": True, **{k: status[k] for k in _PROVISIONING_KEYS if k in status}}


def fleet_snapshot(fleet: Fleet) -> dict[str, Any]:
    """Return the full public snapshot of a fleet: policy resolved, roles derived."""
    fleet.refresh_from_db()
    domains = list(Domain.objects.filter(fleet=fleet))
    slots = list(Slot.objects.filter(domain__fleet=fleet))
    bindings = list(ModelBinding.objects.filter(domain__fleet=fleet))
    out_domains = []
    for d in domains:
        d_slots = []
        for s in slots:
            if s.domain_id != d.id:
                continue
            entry: dict[str, Any] = {
                "id": str(s.id),
                "gpuIndex": s.gpu_index,
                "gpuIndices": s.gpu_indices or [s.gpu_index],
                "migInstance": s.mig_instance or None,
                "kind": s.kind,
                "state": s.state,
                "stateUpdatedAt": iso(s.state_updated_at),
                "spec": s.spec,
                "allocation": s.allocation or None,
            }
            if s.kind == SlotKind.INFERENCE:
                entry["models"] = [
                    {
                        "id": str(b.id),
                        "name": b.name,
                        "servingUrl": b.serving_url,
                        "profile": b.profile or None,
                        "memory": b.memory or None,
                    }
                    for b in bindings
                    if b.slot_id == s.id
                ]
            else:
                entry["pids"] = s.pids
            d_slots.append(entry)
        out_domains.append(
            {
                "id": str(d.id),
                "slug": d.slug,
                "displayName": d.display_name,
                "role": "active" if d.id == fleet.active_domain_id else "standby",
                "provider": d.provider,
                "placement": d.placement,
                "priority": d.priority,
                "supervisorUrl": d.supervisor_url or None,
                "servingBaseUrl": d.serving_base_url or None,
                "gpuLayout": d.gpu_layout or None,
                "state": d.state,
                "lastSeenAt": iso(d.last_seen_at),
                "stateUpdatedAt": iso(d.state_updated_at),
                "slots": d_slots,
                "provisioning": domain_provisioning_json(d),
            }
        )
    return {
        "id": str(fleet.id),
        "slug": fleet.slug,
        "displayName": fleet.display_name,
        "activeDomainId": str(fleet.active_domain_id) if fleet.active_domain_id else None,
        "routeRevision": fleet.route_revision,
        "policy": Policy.resolve(fleet.policy).to_json(),
        "domains": out_domains,
        "operation": operation_json(operation_in_flight(fleet.id)),
        "createdAt": iso(fleet.created_at),
        "updatedAt": iso(fleet.updated_at),
    }


def fleet_summary(fleet: Fleet) -> dict[str, Any]:
    """Return the short form used by the fleet list."""
    return {
        "id": str(fleet.id),
        "slug": fleet.slug,
        "displayName": fleet.display_name,
        "activeDomainId": str(fleet.active_domain_id) if fleet.active_domain_id else None,
        "routeRevision": fleet.route_revision,
    }
