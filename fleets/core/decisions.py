"""Promote and demote requests: accept, answer as a no-op, or refuse before any row is written."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from fleets.core.read_model import DomainView, FleetView
from fleets.core.states import PROMOTABLE_DOMAIN_STATES

INVALID_TARGET = "invalid_target"


class RequestStatus(StrEnum):
    """The `status` of the answer to a request for a change (API and dashboard)."""

    ACCEPTED = "accepted"  # an operation (or a provisioning move) will make it
    ALREADY_ACTIVE = "already_active"  # a promotion of the active: nothing to do
    UNCHANGED = "unchanged"  # a provisioning move already made: nothing to do


@dataclass(frozen=True)
class Decision:
    """What to do with a request: `proceed` creates (or joins) an operation on `target`.

    `target` is the domain the reference resolved to (None when it names no domain of the
    fleet): the one place a request's domain id or slug is resolved.
    """

    outcome: Literal["proceed", "noop", "reject"]
    code: str | None = None
    message: str = ""
    target: DomainView | None = None


def _canonical_id(key: str) -> str:
    """Spell a UUID the way ids are stored (any accepted UUID spelling); else return it as is."""
    try:
        return str(uuid.UUID(key))
    except ValueError:
        return key


def find_domain(fleet: FleetView, ref: str) -> DomainView | None:
    """Return the fleet's domain whose id, else whose slug, equals `ref` (case-insensitive)."""
    # Ids are tried first so a slug that happens to look like another domain's UUID can never
    # shadow it; both are stored lowercase.
    key = ref.strip().lower()
    as_id = _canonical_id(key)
    return next((d for d in fleet.domains if d.id.lower() == as_id), None) or next(
        (d for d in fleet.domains if d.slug == key), None
    )


def _not_in_fleet(fleet: FleetView, ref: str) -> Decision:
    return Decision("reject", INVALID_TARGET, f"domain {ref!r} is not in fleet {fleet.slug!r}")


def _decide(
    fleet: FleetView, target_id: str, rule: Callable[[FleetView, DomainView], Decision]
) -> Decision:
    """Resolve `target_id` (a domain id or slug) and apply `rule` to the domain it names."""
    target = find_domain(fleet, target_id)
    if target is None:
        return _not_in_fleet(fleet, target_id)
    return replace(rule(fleet, target), target=target)


def decide_promotion(fleet: FleetView, target_id: str) -> Decision:
    """Decide a promote request for `target_id` (a domain id or slug)."""
    return _decide(fleet, target_id, _promotion)


def _promotion(fleet: FleetView, target: DomainView) -> Decision:
    if target.id == fleet.active_domain_id:
        # Idempotent: asking again for what already holds is success, not an error.
        return Decision(
            "noop",
            RequestStatus.ALREADY_ACTIVE,
            f"domain {target.slug!r} is already active (route revision {fleet.route_revision})",
        )
    if target.state not in PROMOTABLE_DOMAIN_STATES:
        return _not_up(target, "promoted")
    if not target.has_bindings:
        # Nothing to wake, probe or route to: refuse now rather than burn the wake budget.
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} has no model bindings; promoting it would leave nothing "
            "to serve",
        )
    return Decision("proceed")


def decide_demotion(fleet: FleetView, target_id: str) -> Decision:
    """Decide a demote request for `target_id` (a domain id or slug)."""
    return _decide(fleet, target_id, _demotion)


def _demotion(fleet: FleetView, target: DomainView) -> Decision:
    if target.id == fleet.active_domain_id:
        # Demoting the active would leave the fleet with nothing routable; promote a sibling.
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is the active domain; promote another domain instead",
        )
    if target.state not in PROMOTABLE_DOMAIN_STATES:
        return _not_up(target, "demoted")
    return Decision("proceed")


def _not_up(target: DomainView, done: str) -> Decision:
    """Refuse a domain that is not ready or degraded: a request cannot move it (`done`)."""
    return Decision(
        "reject",
        INVALID_TARGET,
        f"domain {target.slug!r} is {target.state}; only ready or degraded domains can be {done}",
    )
