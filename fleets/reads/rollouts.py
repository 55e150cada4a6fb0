"""Reads of rollouts: one in the public camelCase shape (`RolloutOut`), a fleet's newest, the
one in flight. The API, the admin and the dashboard render from here."""

from __future__ import annotations

from typing import Any

from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.core.timestamps import utc_iso
from fleets.models import Id, Rollout

# GET .../rollouts?limit=: how many of the newest, by default and at most.
DEFAULT_ROLLOUTS = 20
MAX_ROLLOUTS = 200


def _iso(at: Any) -> str | None:
    return utc_iso(at) if at is not None else None


def rollout_json(rollout: Rollout) -> dict[str, Any]:
    """One rollout as the API answers it (the candidate's profile included: it is layout, not
    a secret; an API key is never part of it)."""
    progress = rollout.progress or {}
    return {
        "id": str(rollout.id),
        "fleetId": str(rollout.fleet_id),
        "model": rollout.model,
        "state": rollout.state,
        "pausedFrom": rollout.paused_from or None,
        "pinned": rollout.pinned,
        "abortRequested": rollout.abort_requested,
        "candidate": rollout.candidate,
        "swapMode": rollout.swap_mode,
        "steps": rollout.steps,
        "gates": rollout.gates,
        "stickyHeader": rollout.sticky_header,
        "stepIndex": rollout.step_index,
        "weightPermille": rollout.weight_permille,
        "stableDomainId": str(rollout.stable_domain_id) if rollout.stable_domain_id else None,
        "candidateDomainId": (
            str(rollout.candidate_domain_id) if rollout.candidate_domain_id else None
        ),
        "startedBy": rollout.started_by,
        "why": rollout.why,
        "promotionId": progress.get("promotionId"),
        "breachToWeightChangeMs": progress.get("breachToWeightChangeMs"),
        "progress": progress,
        "version": rollout.version,
        "createdAt": _iso(rollout.created_at),
        "startedAt": _iso(rollout.started_at),
        "stepStartedAt": _iso(rollout.step_started_at),
        "finishedAt": _iso(rollout.finished_at),
        "updatedAt": _iso(rollout.updated_at),
    }


def fleet_rollouts(fleet_id: Id, limit: int = DEFAULT_ROLLOUTS) -> list[Rollout]:
    """The fleet's newest rollouts, newest first (at most MAX_ROLLOUTS)."""
    limit = max(1, min(limit, MAX_ROLLOUTS))
    return list(Rollout.objects.filter(fleet_id=fleet_id).order_by("-created_at")[:limit])


def rollout_current(fleet_id: Id) -> Rollout | None:
    """The fleet's rollout in flight, if any."""
    return Rollout.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_ROLLOUT_STATES).first()
