"""Compare-and-swap state transitions for domains and slots.

Each transition is one conditional UPDATE (`filter(pk=..., state=<what we read>).update(...)`)
whose row count says whether we won; the (from, to) pair is checked against the state tables in
`fleets.core.states` first, so a refused pair raises InvalidTransition and never writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from fleets.base import clock
from fleets.core.states import allowed_sources, check_transition
from fleets.models import Domain, Id, Slot
from fleets.services.events import EventFields, guarded_update


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
    row = Domain.objects.filter(pk=domain_id).values("state", "fleet_id").first()
    if row is None:
        return False
    return _move(
        Domain.objects.filter(pk=domain_id),
        "domain",
        row["state"],
        to_state,
        from_states,
        {},
        {
            "fleet_id": row["fleet_id"],
            "domain_id": domain_id,
            "operation_id": operation_id,
            "kind": f"domain.{to_state}",
            "actor": actor,
            "data": {"from": row["state"], "to": to_state, "reason": reason},
        },
    )


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
    return _move(
        Slot.objects.filter(pk=slot_id),
        row["kind"],
        row["state"],
        to_state,
        from_states,
        extra or {},
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


def _move(
    row: QuerySet[Any],
    table: str,
    state: str,
    to_state: str,
    from_states: Iterable[str] | None,
    extra: dict[str, Any],
    event: EventFields,
) -> bool:
    """Move the `row` read in `state` to `to_state` (with `extra`), recording `event`, if
    `state` is one of `from_states` (default: every state `table` allows it from)."""
    sources = (
        frozenset(from_states) if from_states is not None else allowed_sources(table, to_state)
    )
    if state not in sources or state == to_state:
        return False
    check_transition(table, state, to_state)
    # Guarded by the state we read: a concurrent writer that moved it first wins.
    moved = guarded_update(
        row.filter(state=state),
        {"state": to_state, "state_updated_at": clock.now(), **extra},
        event,
    )
    return bool(moved)
