"""Provisioning writes: begin, advance a phase, record endpoints, fail, stop, stopped.

Each is one conditional UPDATE on the domain guarded by its state and `provision_attempt` (the
claim token: a worker that read attempt N writes only if nobody moved it since, and bumps it),
checked first against the state table (`fleets.core.states`) and the phase table
(`fleets.core.provisioning`). No driver is ever called here: callers call it before or
after, outside any transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from fleets.base import clock
from fleets.base.errors import ErrorCode, ServiceError
from fleets.core.provisioning import PHASES_OF_STATE, Phase, check_phase
from fleets.core.states import DomainState, check_transition
from fleets.core.supervisor_tls import TLS
from fleets.core.urls import without_userinfo
from fleets.drivers.registry import builtin
from fleets.models import Domain, Fleet, ModelBinding
from fleets.services.events import EventFields, guarded_update


class ProvisionRefused(ServiceError):
    """An operator asked for a provisioning move the domain cannot make now."""

    code = ErrorCode.PROVISION_REFUSED
    status = 409


def is_managed(domain: Domain) -> bool:
    """Whether Haru provisions this domain itself (a driver's provider with launch settings)."""
    return domain.provider in builtin().names() and bool(domain.driver)


def _fresh_status(phase: Phase, now: datetime, reason: str) -> dict[str, Any]:
    return {
        "phase": phase.value,
        "startedAt": clock.iso(now),
        "candidate": 0,
        "launches": 0,
        "reason": reason,
    }


def domain_provision_begin(
    *, domain_id: UUID | str, actor: str, reason: str, from_states: frozenset[str] | None = None
) -> bool:
    """Move a managed domain to `provisioning`: from `stopped` it launches; from `failed` it
    first tears the old cluster down (replace). Clears its URLs, which belong to the old
    cluster. Return whether it moved; raise ProvisionRefused for a domain that cannot."""
    domain = _domain_of(domain_id)
    if not is_managed(domain):
        raise ProvisionRefused(
            f"domain {domain.slug!r} is not provisioned by Haru (provider {domain.provider}"
            f"{'' if domain.driver else ', no driver settings'})"
        )
    sources = from_states or frozenset({DomainState.FAILED, DomainState.STOPPED})
    if domain.state not in sources:
        raise ProvisionRefused(
            f"domain {domain.slug!r} is {domain.state}; only a failed or stopped domain is "
            "provisioned (stop it first to replace a live one)"
        )
    _refuse_if_active(domain)
    check_transition("domain", domain.state, DomainState.PROVISIONING)
    old_phase = (domain.driver_status or {}).get("phase", "")
    phase = Phase.LAUNCH if domain.state == DomainState.STOPPED else Phase.REPLACE
    check_phase(old_phase, phase)
    now = clock.now()
    return _domain_enter(
        domain,
        DomainState.PROVISIONING,
        actor,
        {
            "state_updated_at": now,
            "driver_status": _fresh_status(phase, now, reason),
            "supervisor_url": "",
            "serving_base_url": "",
        },
        reason=reason,
    )


def _domain_of(domain_id: UUID | str) -> Domain:
    domain = Domain.objects.filter(pk=domain_id).first()
    if domain is None:
        raise ProvisionRefused("domain not found")
    return domain


def _domain_move(
    domain: Domain,
    values: dict[str, Any],
    *events: EventFields,
    state: str | None = None,
    then: Callable[[], object] | None = None,
) -> int:
    """Write `values` (and the next attempt) if nobody moved the domain since it was read: its
    state (`state`, if given, else the one read) and its attempt, the compare-and-swap every
    provisioning write is guarded by."""
    return guarded_update(
        Domain.objects.filter(
            pk=domain.id,
            state=domain.state if state is None else state,
            provision_attempt=domain.provision_attempt,
        ),
        {**values, "provision_attempt": domain.provision_attempt + 1},
        *events,
        then=then,
    )


def _domain_enter(
    domain: Domain,
    to_state: DomainState,
    actor: str,
    values: dict[str, Any],
    **data: Any,
) -> bool:
    """Move the domain from the state read to `to_state` with `values` (guarded as
    `_domain_move`; `values` may name the `state_updated_at` it shares with them), recording
    `domain.<to_state>` with both states and `data`; return whether it moved."""
    moved = _domain_move(
        domain,
        {"state": to_state, "state_updated_at": clock.now(), **values},
        _event(domain, f"domain.{to_state}", actor, {"from": domain.state, "to": to_state, **data}),
    )
    return bool(moved)


def _refuse_if_active(domain: Domain) -> None:
    """Refuse to provision or stop the domain that serves traffic."""
    active = Fleet.objects.filter(pk=domain.fleet_id).values_list("active_domain_id", flat=True)
    if active.first() == domain.id:
        raise ProvisionRefused(
            f"domain {domain.slug!r} is the active domain; promote another domain first"
        )


def _event(domain: Domain, kind: str, actor: str, data: dict[str, Any]) -> EventFields:
    return {
        "fleet_id": domain.fleet_id,
        "domain_id": domain.id,
        "kind": kind,
        "actor": actor,
        "data": data,
    }


def domain_phase_advance(
    *,
    domain: Domain,
    to_phase: Phase,
    updates: dict[str, Any] | None = None,
    actor: str = "provisioner",
    event: str | None = None,
    event_data: dict[str, Any] | None = None,
) -> Domain | None:
    """Move the domain's driver phase if nobody moved it since `domain` was read; return the
    domain as written, or None when another worker won."""
    status = dict(domain.driver_status or {})
    from_phase = status.get("phase", "")
    if from_phase != to_phase:
        check_phase(from_phase, to_phase)
    if to_phase not in PHASES_OF_STATE.get(domain.state, frozenset()):
        raise ValueError(f"phase {to_phase} does not belong to a {domain.state} domain")
    status.update(updates or {})
    status["phase"] = to_phase.value
    moved = _domain_move(
        domain,
        {"driver_status": status},
        *([_event(domain, event, actor, event_data or {})] if event else []),
    )
    if not moved:
        return None
    domain.driver_status = status
    domain.provision_attempt += 1
    return domain


def domain_endpoints_record(
    *, domain: Domain, supervisor_url: str, serving_base_url: str, actor: str = "provisioner"
) -> bool:
    """Record the URLs of the cluster that came up (phase wait -> up), with the pin of the TLS
    identity its launch shipped (`tlsFingerprint`, recorded when the launch was claimed), and
    point every model binding the layout left without a URL (or at the old base) at the new
    serving base."""
    status = dict(domain.driver_status or {})
    check_phase(status.get("phase", ""), Phase.UP)
    status.update(phase=Phase.UP.value, upAt=clock.iso(clock.now()))

    def repoint_bindings() -> None:
        if serving_base_url:
            stale = {"", domain.serving_base_url} - {serving_base_url}
            ModelBinding.objects.filter(domain_id=domain.id, serving_url__in=stale).update(
                serving_url=serving_base_url
            )

    values: dict[str, Any] = {
        "supervisor_url": supervisor_url,
        "serving_base_url": serving_base_url,
        "driver_status": status,
    }
    data = {
        # Events are shown and exported: never a URL's credentials.
        "supervisorUrl": without_userinfo(supervisor_url),
        "servingBaseUrl": without_userinfo(serving_base_url),
        "candidate": status.get("where"),
    }
    pin = status.get("tlsFingerprint")
    if pin:
        # The launch shipped the host this identity: its pin is trusted with the URL, in the
        # same write, so the supervisor is never called over the new URL without it.
        values.update(supervisor_transport=TLS, supervisor_fingerprint=pin)
        data["supervisorFingerprint"] = pin
    moved = _domain_move(
        domain,
        values,
        _event(domain, "domain.provision.up", actor, data),
        state=DomainState.PROVISIONING,
        then=repoint_bindings,
    )
    return bool(moved)


def domain_provision_fail(
    *, domain: Domain, error: dict[str, Any], actor: str = "provisioner"
) -> bool:
    """Give up this provisioning round: the domain goes `failed` with the driver's error."""
    check_transition("domain", domain.state, DomainState.FAILED)
    status = {**(domain.driver_status or {}), "lastError": error}
    return _domain_enter(
        domain,
        DomainState.FAILED,
        actor,
        {"driver_status": status},
        reason="provisioning",
        error=error,
    )


def domain_stop_request(*, domain_id: UUID | str, actor: str, reason: str = "manual") -> bool:
    """Move a managed, non-active domain to `stopping` (its cluster is torn down next)."""
    domain = _domain_of(domain_id)
    if not is_managed(domain):
        raise ProvisionRefused(
            f"domain {domain.slug!r} is not provisioned by Haru; stop its hosts where they run"
        )
    if domain.state in (DomainState.STOPPING, DomainState.STOPPED):
        return False  # asking twice is what was asked
    _refuse_if_active(domain)
    check_transition("domain", domain.state, DomainState.STOPPING)
    old_phase = (domain.driver_status or {}).get("phase", "")
    check_phase(old_phase, Phase.TEARDOWN)
    now = clock.now()
    status = {
        **(domain.driver_status or {}),
        "phase": Phase.TEARDOWN.value,
        "stopRequestedAt": clock.iso(now),
    }
    return _domain_enter(
        domain,
        DomainState.STOPPING,
        actor,
        {"state_updated_at": now, "driver_status": status},
        reason=reason,
    )


def domain_stopped(*, domain: Domain, mode: str, actor: str = "provisioner") -> bool:
    """Confirm the teardown: `stopping` -> `stopped`, URLs cleared (the cluster is gone)."""
    # The table allows `stopped` from `stopping` only: the write is guarded by `stopping`.
    check_transition("domain", domain.state, DomainState.STOPPED)
    return _domain_enter(
        domain,
        DomainState.STOPPED,
        actor,
        {"supervisor_url": "", "serving_base_url": ""},
        mode=mode,
    )
