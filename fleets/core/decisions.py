"""Promote and demote requests: accept, answer as a no-op, or refuse before any row is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleets.core.states import PROMOTABLE_DOMAIN_STATES
from fleets.core.views import DomainView, FleetView

INVALID_TARGET = "invalid_target"
ALREADY_ACTIVE = "already_active"


@dataclass(frozen=True)
class Decision:
    """What to do with a request: `proceed` creates (or joins) an operation."""

    outcome: Literal["proceed", "noop", "reject"]
    code: str | None = None
    message: str = ""


def find_domain(fleet: FleetView, ref: str) -> DomainView | None:
    """Return the fleet's domain whose id, else whose slug, equals `ref` (case-insensitive)."""
    # Ids are tried first so a slug that happens to look like another domain's UUID can never
    # shadow it; both are stored lowercase.
    key = ref.strip().lower()
    return next((d for d in fleet.domains if d.id.lower() == key), None) or next(
        (d for d in fleet.domains if d.slug == key), None
    )


def _not_in_fleet(fleet: FleetView, ref: str) -> Decision:
    return Decision("reject", INVALID_TARGET, f"domain {ref!r} is not in fleet {fleet.slug!r}")


def decide_promotion(fleet: FleetView, target_id: str) -> Decision:
    """Decide a promote request for `target_id` (a domain id or slug)."""
    target = find_domain(fleet, target_id)
    if target is None:
        return _not_in_fleet(fleet, target_id)
    if target.id == fleet.active_domain_id:
        # Idempotent: asking again for what already holds is success, not an error.
        return Decision(
            "noop",
            ALREADY_ACTIVE,
            f"domain {target.slug!r} is already active (route revision {fleet.route_revision})",
        )
    if target.state not in PROMOTABLE_DOMAIN_STATES:
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is {target.state}; only ready or degraded domains "
            "can be promoted",
        )
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
    target = find_domain(fleet, target_id)
    if target is None:
        return _not_in_fleet(fleet, target_id)
    if target.id == fleet.active_domain_id:
        # Demoting the active would leave the fleet with nothing routable; promote a sibling.
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is the active domain; promote another domain instead",
        )
    if target.state not in PROMOTABLE_DOMAIN_STATES:
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is {target.state}; only ready or degraded domains "
            "can be demoted",
        )
    return Decision("proceed")
