"""Deleting a fleet: refused while an operation is in flight, its history archived first."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction

from fleets.base import clock
from fleets.base.clock import iso
from fleets.base.errors import FleetNotFound, OperationConflict
from fleets.core.states import IN_FLIGHT_OPERATION_STATES
from fleets.models import Event, Fleet, FleetArchive, Operation
from fleets.reads.shapes import operation_json
from fleets.services.access import fleet_access_forget
from fleets.services.layouts import layout_export


def _event_json(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "kind": event.kind,
        "actor": event.actor,
        "domainId": str(event.domain_id) if event.domain_id else None,
        "operationId": str(event.operation_id) if event.operation_id else None,
        "step": event.step or None,
        "durationMs": event.duration_ms,
        "data": event.data,
        "createdAt": iso(event.created_at),
    }


def fleet_delete(*, fleet_id: uuid.UUID | str, actor: str) -> FleetArchive:
    """Delete a fleet with its domains, slots, models, operations and events.

    Refused (OperationConflict) while an operation is in flight: its steps would act on rows
    that no longer exist. Before anything is deleted, the layout, every operation and every
    event are copied into a FleetArchive row in the same transaction, so the history survives
    the delete or the delete does not happen. The routing pointer is cleared first (it
    protects the active domain), inside that transaction. On PostgreSQL the fleet row is
    locked first, so an operation cannot be requested between the check and the delete.
    """
    with transaction.atomic():
        fleet = Fleet.objects.select_for_update().filter(pk=fleet_id).first()
        if fleet is None:
            raise FleetNotFound(f"fleet {fleet_id} not found")
        busy = Operation.objects.filter(
            fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
        ).first()
        if busy is not None:
            raise OperationConflict(
                f"fleet {fleet.slug} cannot be deleted while {busy.kind} of "
                f"{busy.target_slug} is in flight (operation {busy.id}); wait for it to "
                "finish or cancel it",
                operation=busy,
            )
        archive = FleetArchive.objects.create(
            fleet_id=fleet.id,
            slug=fleet.slug,
            deleted_at=clock.now(),
            deleted_by=actor,
            layout=layout_export(fleet),
            operations=[
                operation_json(op)
                for op in Operation.objects.filter(fleet_id=fleet.id).order_by("created_at")
            ],
            events=[_event_json(e) for e in Event.objects.filter(fleet_id=fleet.id).order_by("id")],
        )
        Fleet.objects.filter(pk=fleet.id).update(active_domain=None)
        Event.objects.filter(fleet_id=fleet.id).delete()
        Operation.objects.filter(fleet_id=fleet.id).delete()
        fleet_access_forget(fleet_id=fleet.id)
        Fleet.objects.filter(pk=fleet.id).delete()
    return archive
