"""Append the audit trail and announce it to the live layer after commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction

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
