"""Fail an active whose host is gone, on the data path's evidence (fleets.reconciler.datapath).

The reconciler confirmed, with two targeted checks a short interval apart, that the active's
supervisor and every model server refuse connections. One conditional UPDATE moves it to
failed: still the fleet's active, still ready or degraded, and unchanged since the first check
was taken (a newer heartbeat or an operation step wins over this evidence).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef

from fleets.base import clock
from fleets.core.states import DomainState, check_transition
from fleets.models import Domain, Fleet, Id
from fleets.services.transitions import domain_moved, state_move

_FROM = (DomainState.READY, DomainState.DEGRADED)
# The `reason` of the `domain.failed` event this writes.
UNREACHABLE = "unreachable: supervisor and model servers refuse connections"


def domain_unreachable_fail(
    *,
    domain_id: Id,
    checked_since: datetime,
    now: datetime,
    evidence: dict[str, Any],
    actor: str = "reconciler",
) -> bool:
    """Move the active `domain_id` to failed; return whether it moved.

    `checked_since`: when the first confirming check began; a state change after it is newer
    than the evidence. `evidence` goes into the `domain.failed` event (reason UNREACHABLE, the
    kind every move to failed writes); it holds no secrets.
    """
    for source in _FROM:
        check_transition("domain", source, DomainState.FAILED)
    is_active = Exists(
        Fleet.objects.filter(pk=OuterRef("fleet_id"), active_domain_id=OuterRef("pk"))
    )
    row = Domain.objects.filter(pk=domain_id).values("fleet_id", "state").first()
    if row is None or row["state"] not in _FROM:
        return False
    return state_move(
        Domain.objects.filter(pk=domain_id, state_updated_at__lte=checked_since).filter(is_active),
        "domain",
        row["state"],
        DomainState.FAILED,
        domain_moved(
            row["fleet_id"],
            domain_id,
            row["state"],
            DomainState.FAILED,
            actor,
            UNREACHABLE,
            more={"confirmedAt": clock.iso(now), **evidence},
        ),
        now=now,
    )
