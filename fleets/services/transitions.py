"""Compare-and-swap state transitions for domains and slots.

Each transition is one conditional UPDATE (`filter(pk=..., state=<what we read>).update(...)`)
whose row count says whether we won; the (from, to) pair is checked against the state tables in
`fleets.core.states` first, so a refused pair raises InvalidTransition and never writes.

`state_move` and the event builders (`domain_moved`, `slot_moved`) are the one shape of a state
move and its event: the heartbeat mirrors and the unreachable fail write theirs with them too,
under their own, stricter guards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
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
    domain = Domain.objects.filter(pk=domain_id)
    row = domain.values("state", "fleet_id").first()
    if row is None:
        return False
    event = domain_moved(
        row["fleet_id"], domain_id, row["state"], to_state, actor, reason, operation_id
    )
    return _move(domain, "domain", row["state"], to_state, from_states, {}, event)


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
    slot = Slot.objects.filter(pk=slot_id)
    row = slot.values("state", *SLOT_EVENT_FIELDS).first()
    if row is None:
        return False
    event = slot_moved(row, slot_id, row["state"], to_state, actor, reason, operation_id)
    return _move(slot, row["kind"], row["state"], to_state, from_states, extra or {}, event)


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
    return state_move(row, table, state, to_state, event, now=clock.now(), extra=extra)


def state_move(
    rows: QuerySet[Any],
    table: str,
    from_state: str,
    to_state: str,
    event: EventFields,
    *,
    now: datetime,
    extra: Mapping[str, Any] | None = None,
) -> bool:
    """Move the row `rows` selects from `from_state` to `to_state` (stamped `now`, with
    `extra`), recording `event`; return whether it moved. A pair `table` refuses raises.

    Guarded by the state read: a concurrent writer that moved it first wins. `rows` may guard
    more (unchanged since a report was taken, still the fleet's active)."""
    check_transition(table, from_state, to_state)
    moved = guarded_update(
        rows.filter(state=from_state),
        {"state": to_state, "state_updated_at": now, **(extra or {})},
        event,
    )
    return bool(moved)


# What `slot_moved` needs of the slot's row, beside its id.
SLOT_EVENT_FIELDS = ("kind", "domain_id", "domain__fleet_id")


def slot_moved(
    row: Mapping[str, Any],
    slot_id: Id,
    from_state: str,
    to_state: str,
    actor: str,
    reason: str,
    operation_id: Id | None = None,
) -> EventFields:
    """The event of a slot's move (`slot.<kind>.<to>`); `row` holds SLOT_EVENT_FIELDS."""
    return {
        "fleet_id": row["domain__fleet_id"],
        "domain_id": row["domain_id"],
        "operation_id": operation_id,
        "kind": f"slot.{row['kind']}.{to_state}",
        "actor": actor,
        "data": {"slotId": str(slot_id), "from": from_state, "to": to_state, "reason": reason},
    }


def domain_moved(
    fleet_id: Id,
    domain_id: Id,
    from_state: str,
    to_state: str,
    actor: str,
    reason: str,
    operation_id: Id | None = None,
    more: Mapping[str, Any] | None = None,
) -> EventFields:
    """The event of a domain's move (`domain.<to>`), with any `more` data it carries."""
    return {
        "fleet_id": fleet_id,
        "domain_id": domain_id,
        "operation_id": operation_id,
        "kind": f"domain.{to_state}",
        "actor": actor,
        "data": {"from": from_state, "to": to_state, "reason": reason, **(more or {})},
    }
