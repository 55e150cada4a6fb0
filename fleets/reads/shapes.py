"""The public JSON shapes, each rendered by exactly one function.

The API, the live layer (`broadcast`) and the `reconcile` command all render through these, and
`fleets/api/serializers.py` describes the same shapes for the OpenAPI schema;
`tests/api/test_api_shapes.py` checks every live answer against that schema, so the two cannot
drift apart. Rendering only: the database reads that feed them are in `fleets/reads/selectors.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleets.base.clock import iso
from fleets.core.backoff import Backoff
from fleets.core.flapping import Damping
from fleets.core.policy import Policy
from fleets.core.states import DomainRole, SlotKind
from fleets.core.urls import without_userinfo
from fleets.models import Domain, Fleet, GoldenBaseline, ModelBinding, Operation, Slot
from fleets.reads.continued_streams import operation_streams_continued


def operation_json(op: Operation | None) -> dict[str, Any] | None:
    """Render an operation in the public camelCase contract (`OperationOut`).

    With its one derived figure that is not a column, `streamsContinued`
    (fleets/reads/continued_streams.py): read here so that every answer showing an operation
    shows the same count as the fleet page."""
    if op is None:
        return None
    return {
        **_operation_fields(op),
        "streamsContinued": operation_streams_continued(op),
    }


def _operation_fields(op: Operation) -> dict[str, Any]:
    """The operation's own columns, in the public camelCase contract."""
    return {
        "id": str(op.id),
        "fleetId": str(op.fleet_id),
        "kind": op.kind,
        "drillMode": op.drill_mode or None,
        "state": op.state,
        "targetDomainId": str(op.target_domain_id) if op.target_domain_id else None,
        "targetDomainSlug": op.target_domain_slug or None,
        "sourceDomainId": str(op.source_domain_id) if op.source_domain_id else None,
        "currentStep": op.current_step or None,
        "stepStartedAt": iso(op.step_started_at),
        "routingCommitted": op.routing_committed,
        "servedAt": iso(op.served_at),
        "error": op.error,
        "cleanup": op.cleanup or None,
        "reason": op.reason,
        "requestedBy": op.requested_by,
        "createdAt": iso(op.created_at),
        "startedAt": iso(op.started_at),
        "finishedAt": iso(op.finished_at),
    }


def cancel_json(status: str, op: Operation, skipped_steps: Iterable[str]) -> dict[str, Any]:
    """Render what an operator's cancel did (`CancelledOut`)."""
    return {"status": status, "operation": operation_json(op), "skippedSteps": list(skipped_steps)}


# What a live message carries of its operation: enough for the dashboard to show the step at
# once (it re-fetches the page for the rest). A subset of `operation_json`, rendered by it.
LIVE_OPERATION_KEYS = (
    "id",
    "kind",
    "state",
    "currentStep",
    "stepStartedAt",
    "targetDomainId",
    "error",
)


def live_operation_json(op: Operation | None) -> dict[str, Any] | None:
    """Render the part of an operation a live message carries."""
    if op is None:
        return None
    fields = _operation_fields(op)
    return {key: fields[key] for key in LIVE_OPERATION_KEYS}


def fleet_pointer_json(fleet: Fleet) -> dict[str, Any]:
    """Render where a fleet routes: the start of `FleetSummaryOut` and of every live message."""
    return {
        "id": str(fleet.id),
        "slug": fleet.slug,
        "activeDomainId": str(fleet.active_domain_id) if fleet.active_domain_id else None,
        "routeRevision": fleet.route_revision,
    }


def fleet_summary_json(fleet: Fleet) -> dict[str, Any]:
    """Render the short form used by the fleet list (`FleetSummaryOut`)."""
    pointer = fleet_pointer_json(fleet)
    return {
        "id": pointer["id"],
        "slug": pointer["slug"],
        "displayName": fleet.display_name,
        "activeDomainId": pointer["activeDomainId"],
        "routeRevision": pointer["routeRevision"],
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


def model_json(binding: ModelBinding) -> dict[str, Any]:
    """Render one served model of an inference slot (`ModelOut`)."""
    return {
        "id": str(binding.id),
        "name": binding.name,
        "servingUrl": without_userinfo(binding.serving_url),
        "profile": binding.profile or None,
        "memory": binding.memory or None,
        "health": binding.health,
        "healthAt": iso(binding.health_at),
        "servingSeenAt": iso(binding.serving_seen_at),
    }


def slot_json(slot: Slot, bindings: Iterable[ModelBinding]) -> dict[str, Any]:
    """Render one slot (`SlotOut`); `bindings` may hold other slots' models, they are skipped."""
    entry: dict[str, Any] = {
        "id": str(slot.id),
        "gpuIndex": slot.gpu_index,
        "gpuIndices": slot.gpu_indices or [slot.gpu_index],
        "migInstance": slot.mig_instance or None,
        "kind": slot.kind,
        "state": slot.state,
        "stateUpdatedAt": iso(slot.state_updated_at),
        "spec": slot.spec,
        "allocation": slot.allocation or None,
    }
    if slot.kind == SlotKind.INFERENCE:
        entry["models"] = [model_json(b) for b in bindings if b.slot_id == slot.id]
    else:
        entry["pids"] = slot.pids
    return entry


def failover_backoff_json(backoff: Backoff | None) -> dict[str, Any] | None:
    """Render a standby's backoff after failed automatic promotions (`FailoverBackoffOut`)."""
    if backoff is None:
        return None
    return {
        "failures": backoff.failures,
        "lastFailedAt": iso(backoff.last_failed_at),
        "nextAttemptAt": iso(backoff.next_attempt_at),
    }


def domain_json(
    domain: Domain,
    *,
    active_domain_id: Any,
    slots: Iterable[Slot],
    bindings: Iterable[ModelBinding],
    backoff: Backoff | None = None,
) -> dict[str, Any]:
    """Render one domain (`DomainOut`); `slots` may hold other domains' slots, they are skipped."""
    bindings = list(bindings)
    return {
        "id": str(domain.id),
        "slug": domain.slug,
        "displayName": domain.display_name,
        "role": (DomainRole.ACTIVE if domain.id == active_domain_id else DomainRole.STANDBY).value,
        "provider": domain.provider,
        "placement": domain.placement,
        "priority": domain.priority,
        # Credentials stripped from rows stored before URLs with them were refused.
        "supervisorUrl": without_userinfo(domain.supervisor_url) or None,
        "supervisorTransport": domain.supervisor_transport,
        "supervisorFingerprint": domain.supervisor_fingerprint or None,
        "servingBaseUrl": without_userinfo(domain.serving_base_url) or None,
        "gpuLayout": domain.gpu_layout or None,
        "state": domain.state,
        "lastSeenAt": iso(domain.last_seen_at),
        "stateUpdatedAt": iso(domain.state_updated_at),
        "slots": [slot_json(s, bindings) for s in slots if s.domain_id == domain.id],
        "provisioning": domain_provisioning_json(domain),
        "failoverBackoff": failover_backoff_json(backoff),
    }


def failover_damping_json(damping: Damping | None, window_ms: int) -> dict[str, Any] | None:
    """Render the fleet's flap damping (`FailoverDampingOut`); None when it is not damped."""
    if damping is None:
        return None
    return {
        "failovers": damping.failovers,
        "windowMs": window_ms,
        "holdDownMs": damping.confirm_ms,
        "lastFailoverAt": iso(damping.last_at),
        "until": iso(damping.until),
    }


def fleet_json(
    fleet: Fleet,
    *,
    domains: Iterable[Domain],
    slots: Iterable[Slot],
    bindings: Iterable[ModelBinding],
    operation: Operation | None,
    backoffs: Mapping[str, Backoff] | None = None,
    damping: Damping | None = None,
) -> dict[str, Any]:
    """Render the full public snapshot of a fleet (`FleetOut`): policy resolved, roles derived."""
    slots, bindings = list(slots), list(bindings)
    held = backoffs or {}
    policy = Policy.resolve(fleet.policy)
    return {
        **fleet_summary_json(fleet),
        "policy": policy.to_json(),
        "domains": [
            domain_json(
                d,
                active_domain_id=fleet.active_domain_id,
                slots=slots,
                bindings=bindings,
                backoff=held.get(str(d.id)),
            )
            for d in domains
        ],
        "operation": operation_json(operation),
        "failoverDamping": failover_damping_json(damping, policy.flap_window_ms),
        "createdAt": iso(fleet.created_at),
        "updatedAt": iso(fleet.updated_at),
    }


def baseline_json(b: GoldenBaseline) -> dict[str, Any]:
    """Render one golden baseline (`BaselineOut`)."""
    return {
        "model": b.model_name,
        "adapter": b.adapter or None,
        "profileFingerprint": b.profile_fingerprint,
        "engineVersion": b.engine_version or None,
        "requestFingerprint": b.request_fingerprint,
        "answerSha256": b.answer_sha256,
        "answer": b.answer,
        "domain": b.domain.slug if b.domain is not None else None,
        "reason": b.reason,
        "recordedBy": b.recorded_by,
        "recordedAt": iso(b.recorded_at),
    }
