"""Compare-and-swap state transitions for domains and slots.

Each transition is one conditional UPDATE (`filter(pk=..., state=<what we read>).update(...)`)
whose row count says whether we won; the (from, to) pair is checked against the state tables in
`fleets.core.states` first, so a refused pair raises InvalidTransition and never writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleets.base import clock
from fleets.core.states import allowed_sources, check_transition
from fleets.models import Domain, Id, Slot
from fleets.services.events import guarded_update


def domain_transition(
    *,
    domain_id: Id,
    to_state: str,
    from_states: Iterable[str] | None = None,
    actor: str = "system",
    reason: str = "",
    operation_id: Id | None = None,
) -> bool:
    """Move a domain to `to_state` if it is in one of `from_states`; return whether it moved."""
    sources = (
        frozenset(from_states) if from_states is not None else allowed_sources("domain", to_state)
    )
    row = Domain.objects.filter(pk=domain_id).values("state", "fleet_id").first()
    if row is None or row["state"] not in sources or row["state"] == to_state:
        return False
    check_transition("domain", row["state"], to_state)
    # Guarded by the state we read: a concurrent writer that moved it first wins.
    moved = guarded_update(
        Domain.objects.filter(pk=domain_id, state=row["state"]),
        {"state": to_state, "state_updated_at": clock.now()},
        {
            "fleet_id": row["fleet_id"],
            "domain_id": domain_id,
            "operation_id": operation_id,
            "kind": f"domain.{to_state}",
            "actor": actor,
            "data": {"from": row["state"], "to": to_state, "reason": reason},
        },
    )
    return bool(moved)


def slot_transition(
    *,
    slot_id: Id,
    to_state: str,
    from_states: Iterable[str] | None = None,
    actor: str = "system",
    reason: str = "",
    operation_id: Id | None = None,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Move one slot to `to_state` if it is in one of `from_states`; return whether it moved."""
    row = (
        Slot.objects.filter(pk=slot_id)
        .values("state", "kind", "domain_id", "domain__fleet_id")
        .first()
    )
    if row is None:
        return False
    sources = (
        frozenset(from_states)
        if from_states is not None
        else allowed_sources(row["kind"], to_state)
    )
    if row["state"] not in sources or row["state"] == to_state:
        return False
    check_transition(row["kind"], row["state"], to_state)
    moved = guarded_update(
        Slot.objects.filter(pk=slot_id, state=row["state"]),
        {"state": to_state, "state_updated_at": clock.now(), **(extra or {})},
        {
            "fleet_id": row["domain__fleet_id"],
            "domain_id": row["domain_id"],
            "operation_id": operation_id,
            "kind": f"slot.{row['kind']}.{to_state}",
            "actor": actor,
            "data": {
                "slotId": str(slot_id),
                "from": row["state"],
                "to": to_state,
                "reason": reason,
            },
        },
    )
    return bool(moved)
