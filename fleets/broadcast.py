"""Announce state changes to the live layer: one Channels group per fleet.

Called only from `transaction.on_commit`, so a browser never sees a change that rolled back.
A broadcast failure (Redis down) is logged and dropped: the control path must not fail because
a dashboard could not be told.

Which event loop sends: the in-memory layer's queues belong to the ASGI server's loop, and a
consumer waiting on one is only woken from that loop. A change made on a plain thread (the
in-process reconcile loop) would otherwise be queued from a throwaway loop by `async_to_sync`
and reach the browser only when something else woke the server's loop, seconds later. So the
live consumers register the server's loop (`bind_loop`) and every send from another thread is
handed to it; with no server loop (a Celery worker, a management command) `async_to_sync` is
used, which is what channels_redis needs there.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

# Long enough for a healthy loop to take the message; short enough that a wedged server loop
# cannot stall the reconcile tick that committed the change.
_HANDOFF_TIMEOUT_S = 2.0

_server_loop: asyncio.AbstractEventLoop | None = None
_server_loop_lock = threading.Lock()


def fleet_group(fleet_id) -> str:
    return f"fleet.{fleet_id}"


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the ASGI server's event loop (called by the live consumers on connect)."""
    global _server_loop
    with _server_loop_lock:
        _server_loop = loop


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def publish(fleet_id, message: dict) -> None:
    """Send `message` (a dict with a "type" that names the consumer handler) to the fleet."""
    layer = get_channel_layer()
    if layer is None:
        return
    group = fleet_group(fleet_id)
    try:
        loop = _server_loop
        if loop is not None and loop.is_running() and not loop.is_closed():
            if _running_loop() is loop:
                # Already on the server's loop (async code): queue it without blocking the loop.
                loop.create_task(layer.group_send(group, message))
                return
            # Wait for the hand-off so messages from one thread keep their commit order.
            future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
            future.result(timeout=_HANDOFF_TIMEOUT_S)
            return
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # noqa: BLE001 - the live layer is best effort by design
        log.warning("broadcast to fleet %s failed", fleet_id, exc_info=True)


def fleet_state(fleet_id, operation_id=None) -> dict | None:
    """Read the fleet's routing state and its operation as they are now (after commit).

    The operation is the event's own when it names one (so a finished operation's last message
    says how it ended), else the one in flight. Two indexed reads; None if the fleet is gone.
    """
    from fleets.core.states import IN_FLIGHT_OPERATION_STATES
    from fleets.models import Fleet, Operation

    row = (
        Fleet.objects.filter(pk=fleet_id)
        .values("id", "slug", "active_domain_id", "route_revision")
        .first()
    )
    if row is None:
        return None
    ops = Operation.objects.only(
        "id", "kind", "state", "current_step", "step_started_at", "target_domain_id", "error"
    )
    op = ops.filter(pk=operation_id).first() if operation_id else None
    if op is None:
        op = ops.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES).first()
    return {
        "id": str(row["id"]),
        "slug": row["slug"],
        "activeDomainId": str(row["active_domain_id"]) if row["active_domain_id"] else None,
        "routeRevision": row["route_revision"],
        "operation": None
        if op is None
        else {
            "id": str(op.id),
            "kind": op.kind,
            "state": op.state,
            "currentStep": op.current_step or None,
            "stepStartedAt": _iso(op.step_started_at),
            "targetDomainId": str(op.target_domain_id),
            "error": op.error,
        },
    }


def _iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _safe_state(fleet_id, operation_id=None) -> dict | None:
    try:
        return fleet_state(fleet_id, operation_id)
    except Exception:  # noqa: BLE001 - a failed read must not stop the event from going out
        log.warning("could not read state of fleet %s for broadcast", fleet_id, exc_info=True)
        return None


def publish_fleet_state(fleet_id) -> None:
    """Broadcast the fleet's current state without an event (e.g. after a heartbeat changed
    only `last_seen_at` or `last_report`), as a `fleet.state` message. Call after commit."""
    publish(fleet_id, {"type": "fleet.state", "fleet": _safe_state(fleet_id)})


def publish_event(event) -> None:
    """Broadcast one Event row as a `fleet.event` message, with the fleet's state after it.

    Exactly one message per Event row: the dashboard applies `fleet` (pointer, revision, the
    operation's step) at once and re-fetches the rest of the page.
    """
    publish(
        event.fleet_id,
        {
            "type": "fleet.event",
            "fleet": _safe_state(event.fleet_id, event.operation_id),
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
