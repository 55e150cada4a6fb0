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
from fleets.services.events import guarded_update

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
    moved = guarded_update(
        Domain.objects.filter(
            pk=domain_id, state=row["state"], state_updated_at__lte=checked_since
        ).filter(is_active),
        {"state": DomainState.FAILED, "state_updated_at": now},
        {
            "fleet_id": row["fleet_id"],
            "domain_id": domain_id,
            "kind": "domain.failed",
            "actor": actor,
            "data": {
                "from": row["state"],
                "to": DomainState.FAILED,
                "reason": UNREACHABLE,
                "confirmedAt": clock.iso(now),
                **evidence,
            },
        },
    )
    return bool(moved)
