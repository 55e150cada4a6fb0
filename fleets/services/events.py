"""Append the audit trail and announce it to the live layer after commit; write a guarded
update together with the events it owes (`guarded_update`), and the "not older news" guard
(`not_newer`) the writes of what a heartbeat observed share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Required, TypedDict

from django.db import transaction
from django.db.models import Q, QuerySet

from fleets.base import clock
from fleets.models import Event, Id
from fleets.services import broadcast


def event_record(
    *,
    fleet_id: Id,
    kind: str,
    actor: str = "system",
    domain_id: Id | None = None,
    operation_id: Id | None = None,
    step: str = "",
    duration_ms: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Write one Event row and broadcast it to the fleet's group once the transaction commits."""
    event = Event.objects.create(
        fleet_id=fleet_id,
        kind=kind,
        actor=actor,
        domain_id=domain_id,
        operation_id=operation_id,
        step=step,
        duration_ms=duration_ms,
        data=data or {},
        created_at=clock.now(),
    )
    # Broadcasting is a side effect: only after commit, so nobody sees a rolled-back change.
    # The hook only queues the message (the publisher thread reads state and sends), so a
    # commit inside a reconcile tick pays microseconds, not a channel-layer round trip; robust:
    # a failure to queue never stops the other commit hooks.
    transaction.on_commit(lambda: broadcast.publish_event(event), robust=True)
    return event


class EventFields(TypedDict, total=False):
    """`event_record`'s arguments: an event a guarded update records if it moved."""

    fleet_id: Required[Id]
    kind: Required[str]
    actor: str
    domain_id: Id | None
    operation_id: Id | None
    step: str
    duration_ms: int | None
    data: dict[str, Any] | None


def guarded_update(
    guard: QuerySet[Any],
    values: Mapping[str, Any],
    *events: EventFields,
    then: Callable[[], object] | None = None,
) -> int:
    """Apply `values` to the rows `guard` selects; only if one moved, record `events` and run
    `then`; all in one transaction. Return how many rows moved.

    The guard is the compare-and-swap: its filter names what the caller read (a state, a step),
    so a concurrent writer that moved the row first wins and this call writes no event.
    """
    with transaction.atomic():
        moved = guard.update(**values)
        if moved:
            for event in events:
                event_record(**event)
            if then is not None:
                then()
    return moved


def not_newer(field: str, at: datetime, *, tie_wins: bool = False) -> Q:
    """Match rows whose `field` is unset or older than `at` (or equal to it, when a tie goes to
    this write): a slower tick finishing after a faster one must not write older news over
    newer."""
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__{'lte' if tie_wins else 'lt'}": at})
