"""Announce state changes to the live layer: one Channels group per fleet.

Called only from `transaction.on_commit`, so a browser never sees a change that rolled back.
A broadcast failure (Redis down) is logged and dropped: the control path must not fail because
a dashboard could not be told.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def fleet_group(fleet_id) -> str:
    return f"fleet.{fleet_id}"


def publish(fleet_id, message: dict) -> None:
    """Send `message` (a dict with a "type" that names the consumer handler) to the fleet."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(fleet_group(fleet_id), message)
    except Exception:  # noqa: BLE001 - the live layer is best effort by design
        log.warning("broadcast to fleet %s failed", fleet_id, exc_info=True)


def publish_event(event) -> None:
    """Broadcast one Event row as a `fleet.event` message."""
    publish(
        event.fleet_id,
        {
            "type": "fleet.event",
            "event": {
                "id": event.id,
                "kind": event.kind,
                "step": event.step,
                "domainId": str(event.domain_id) if event.domain_id else None,
                "operationId": str(event.operation_id) if event.operation_id else None,
                "durationMs": event.duration_ms,
                "data": event.data,
                "createdAt": event.created_at.isoformat().replace("+00:00", "Z"),
            },
        },
    )
