"""Announce state changes to the live layer: one Channels group per fleet.

Called only from `transaction.on_commit`, so a browser never sees a change that rolled back.
A broadcast failure (Redis down) is logged and dropped: the control path must not fail because
a dashboard could not be told.

Off the hot path: the commit hook reads the fleet's state as that commit left it (one indexed
statement, tens of microseconds) and appends the message to this process's publisher queue; one
background thread per process sends, in FIFO order, so messages leave in the order their
transactions committed in this process. The queue is bounded: if the
layer is wedged and it fills, the oldest message is dropped and counted
(`haru_broadcast_dropped_total`), and the caller is never blocked. The browser re-fetches the
page on every message, so a dropped one costs a stale view until the next, not a wrong one.

Which event loop sends: the in-memory layer's queues belong to the ASGI server's loop, and a
consumer waiting on one is only woken from that loop. A change made on a plain thread (the
in-process reconcile loop) would otherwise be queued from a throwaway loop by `async_to_sync`
and reach the browser only when something else woke the server's loop, seconds later. So the
live consumers register the server's loop (`bind_loop`) and every send from the publisher
thread is handed to it; with no server loop (a Celery worker, a management command) the
publisher thread runs the send on its own long-lived loop (channels_redis needs a loop there).

`flush(timeout)` waits until everything queued before it was sent: tests call it instead of
sleeping. Never call it on the server's loop (the sends it waits for need that loop).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from channels.layers import get_channel_layer
from django.db import close_old_connections, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils.dateparse import parse_datetime
from prometheus_client import Counter

from fleets.base import clock
from fleets.core.states import IN_FLIGHT_OPERATION_STATES
from fleets.models import Event, Fleet, Operation
from fleets.reads import shapes

log = logging.getLogger(__name__)

# Long enough for a healthy loop to take the message; short enough that a wedged server loop
# cannot hold the publisher (and so every later message) for long.
_HANDOFF_TIMEOUT_S = 2.0
# Room for far more messages than a failover produces (a few dozen): only a wedged layer fills it.
QUEUE_LIMIT = 1000
# An idle publisher gives its database connection back after this long (a burst reuses it).
_IDLE_CLOSE_S = 1.0

DROPPED = Counter(
    "haru_broadcast_dropped_total",
    "Live-layer messages dropped because the publisher queue was full (a wedged channel layer).",
)

_server_loop: asyncio.AbstractEventLoop | None = None
_server_loop_lock = threading.Lock()


def fleet_group(fleet_id: object) -> str:
    return f"fleet.{fleet_id}"


# Every fleet's messages also go here: the overview listens to it, so a fleet created after the
# socket opened (its first event is `layout.applied`) shows up at once.
ALL_FLEETS_GROUP = "fleets.all"


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


# ---------------------------------------------------------------------------------------------
# The publisher: one thread, one ordered, bounded queue per process
# ---------------------------------------------------------------------------------------------


class Publisher:
    """Run queued jobs on one lazily started daemon thread, in the order they were queued."""

    def __init__(self, *, limit: int = QUEUE_LIMIT, idle_close_s: float = _IDLE_CLOSE_S) -> None:
        self.limit = limit
        self.idle_close_s = idle_close_s
        self._reset()

    def _reset(self) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._queued = 0  # jobs ever queued
        self._finished = 0  # jobs run or dropped
        self.dropped = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Queue `job`; never blocks on the layer. A full queue drops its oldest job."""
        dropped = False
        with self._cond:
            if len(self._jobs) >= self.limit:
                self._jobs.popleft()
                self._finished += 1
                self.dropped += 1
                dropped = True
            self._jobs.append(job)
            self._queued += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="haru-broadcast", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        if dropped:
            DROPPED.inc()
            # One line per power of two: a wedged layer must not flood the log as well.
            if self.dropped & (self.dropped - 1) == 0:
                log.warning(
                    "broadcast queue full (%d): dropped the oldest message (%d dropped so far)",
                    self.limit,
                    self.dropped,
                )

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every job queued before this call has run; return False on timeout."""
        with self._cond:
            target = self._queued
            return self._cond.wait_for(lambda: self._finished >= target, timeout)

    def pending(self) -> int:
        with self._cond:
            return self._queued - self._finished

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._cond.wait_for(
                    lambda: bool(self._jobs), self.idle_close_s
                ):
                    idle = True
                else:
                    idle = False
                    job = self._jobs.popleft()
            if idle:
                # Nothing for a while: give the connection back instead of holding it idle.
                try:
                    connections.close_all()
                except Exception:  # noqa: BLE001 - a dead connection is closed either way
                    log.debug("closing the publisher's connections failed", exc_info=True)
                with self._cond:
                    self._cond.wait_for(lambda: bool(self._jobs))
                continue
            try:
                # Autocommit reads only (no transaction is ever opened here); a connection past
                # its max age or broken by the last job is replaced first.
                close_old_connections()
                job()
            except Exception:  # noqa: BLE001 - one bad message must not stop the publisher
                log.warning("broadcast job failed", exc_info=True)
            finally:
                with self._cond:
                    self._finished += 1
                    self._cond.notify_all()


_publisher = Publisher()


def _after_fork_in_child() -> None:
    # A forked child (a Celery prefork worker) has no publisher thread, and the parent's lock
    # may have been held at the fork: start from a fresh, empty publisher. Nor does it run the
    # parent's server loop, which would still look running from here.
    global _server_loop
    _server_loop = None
    _publisher._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def publisher() -> Publisher:
    """Return this process's publisher (for its counters and tests)."""
    return _publisher


def flush(timeout: float = 5.0) -> bool:
    """Wait until every message queued so far was handed to the layer (tests, shutdown).

    Blocking: from async code use `await asyncio.to_thread(broadcast.flush)`.
    """
    loop = _running_loop()
    if loop is not None and loop is _server_loop:
        raise RuntimeError("flush() would block the server loop its sends need: run it on a thread")
    return _publisher.flush(timeout)


@atexit.register
def _flush_at_exit() -> None:
    # A management command that committed a change just before exiting still announces it.
    if _publisher.pending():
        _publisher.flush(timeout=2.0)


# ---------------------------------------------------------------------------------------------
# Sending (on the publisher thread)
# ---------------------------------------------------------------------------------------------


_local = threading.local()


def _own_loop() -> asyncio.AbstractEventLoop:
    """Return this thread's private event loop for sends when no server loop is bound.

    What `async_to_sync` did per message, done once: it started a thread and a loop for every
    send (and channels_redis a connection per loop), and it cannot run at interpreter exit,
    when the last messages are flushed. channels_redis keeps one pool per loop, so a loop that
    lives as long as the publisher reuses its connection.
    """
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def _send(fleet_id: object, message: dict[str, Any]) -> None:
    """Send `message` to the fleet's group now (the publisher thread's half of `publish`)."""
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_both() -> None:
        await layer.group_send(fleet_group(fleet_id), message)
        await layer.group_send(ALL_FLEETS_GROUP, message)

    try:
        loop = _server_loop
        if loop is not None and loop.is_running() and not loop.is_closed():
            # Wait for the hand-off so messages keep their order on the way to the browser.
            future = asyncio.run_coroutine_threadsafe(send_both(), loop)
            future.result(timeout=_HANDOFF_TIMEOUT_S)
            return
        _own_loop().run_until_complete(send_both())
    except Exception:  # noqa: BLE001 - the live layer is best effort by design
        log.warning("broadcast to fleet %s failed", fleet_id, exc_info=True)


# The state read, as one statement: the event's own operation when it names one (so a finished
# operation's last message says how it ended), else the one in flight (at most one per fleet,
# served by uq_operation_one_inflight_per_fleet). Raw SQL on purpose: it runs in the commit hook
# of every state change, and the two ORM queries it replaces cost 5x to 13x as much
# (`bench/broadcast_state.py`: on a loaded two-core machine, 0.15 ms against 1.6 ms on SQLite).
_STATE_SQL: dict[str, str] = {}
_IN_FLIGHT = tuple(sorted(str(s) for s in IN_FLIGHT_OPERATION_STATES))


def _state_sql(connection: BaseDatabaseWrapper) -> str:
    sql = _STATE_SQL.get(connection.vendor)
    if sql is None:
        q = connection.ops.quote_name

        def col(model: type[Model], name: str) -> str:
            field = model._meta.get_field(name)
            assert isinstance(field, Field)  # a concrete column, never a relation's reverse
            return str(q(field.column))

        fleet, op = q(Fleet._meta.db_table), q(Operation._meta.db_table)
        op_fields = ("id", "kind", "state", "current_step", "step_started_at", "target_domain")
        sql = _STATE_SQL[connection.vendor] = (
            f"SELECT f.{col(Fleet, 'id')}, f.{col(Fleet, 'slug')}, "
            f"f.{col(Fleet, 'active_domain')}, f.{col(Fleet, 'route_revision')}, "
            + ", ".join(f"o.{col(Operation, n)}" for n in op_fields)
            + f", o.{col(Operation, 'error')} FROM {fleet} f LEFT JOIN {op} o ON "
            f"o.{col(Operation, 'id')} = COALESCE("
            f"(SELECT e.{col(Operation, 'id')} FROM {op} e WHERE e.{col(Operation, 'id')} = %s), "
            f"(SELECT i.{col(Operation, 'id')} FROM {op} i "
            f"WHERE i.{col(Operation, 'fleet')} = f.{col(Fleet, 'id')} "
            f"AND i.{col(Operation, 'state')} IN ({', '.join(['%s'] * len(_IN_FLIGHT))}) "
            "LIMIT 1)) "
            f"WHERE f.{col(Fleet, 'id')} = %s"
        )
    return sql


def fleet_state(fleet_id: object, operation_id: object = None) -> dict[str, Any] | None:
    """Read the fleet's routing state and its operation as they are now (after commit).

    The operation is the event's own when it names one, else the one in flight. One indexed
    statement; None if the fleet is gone.
    """

    params = [
        Operation._meta.pk.get_db_prep_value(operation_id, connection) if operation_id else None,
        *_IN_FLIGHT,
        Fleet._meta.pk.get_db_prep_value(fleet_id, connection),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_state_sql(connection), params)
        row = cursor.fetchone()
    if row is None:
        return None
    fid, slug, active_id, revision, op_id, kind, state, step, started, target, error = row
    # Rendered by the same functions as the API (an unsaved model from the row; no query).
    pointer = Fleet(
        id=_uuid(fid), slug=slug, active_domain_id=_uuid(active_id), route_revision=revision
    )
    operation = (
        None
        if op_id is None
        else Operation(
            id=_uuid(op_id),
            kind=kind,
            state=state,
            current_step=step or "",
            step_started_at=_aware(started),
            target_domain_id=uuid.UUID(str(target)),  # never null; one spelling
            error=json.loads(error) if isinstance(error, str | bytes) else error,
        )
    )
    live = shapes.live_operation_json(operation)
    return {**shapes.fleet_pointer_json(pointer), "operation": live}


def _uuid(value: object) -> str | None:
    # SQLite stores UUIDs as 32 hex digits, PostgreSQL as uuid: one canonical string either way.
    return None if value is None else str(uuid.UUID(str(value)))


def _aware(value: object) -> datetime | None:
    moment = parse_datetime(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _safe_state(fleet_id: object, operation_id: object = None) -> dict[str, Any] | None:
    try:
        return fleet_state(fleet_id, operation_id)
    except Exception:  # noqa: BLE001 - a failed read must not stop the event from going out
        log.warning("could not read state of fleet %s for broadcast", fleet_id, exc_info=True)
        return None


def publish_event(event: Event) -> None:
    """Queue one Event row as a `fleet.event` message, with the fleet's state right after it.

    Exactly one message per Event row: the dashboard applies `fleet` (pointer, revision, the
    operation's step) at once and re-fetches the rest of the page. The state is read here, in
    the commit hook (one indexed statement, microseconds), not on the publisher thread: by the
    time that thread runs, the tick may have committed the next step, and a step that lasts a
    few milliseconds (switch_route) would never be shown. Only the send is deferred.
    """
    message = _event_message(event, _safe_state(event.fleet_id, event.operation_id))
    _publisher.submit(lambda: _send(event.fleet_id, message))


def _event_message(event: Event, state: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "fleet.event",
        "fleet": state,
        "event": {
            "id": event.id,
            "kind": event.kind,
            "step": event.step,
            "domainId": str(event.domain_id) if event.domain_id else None,
            "operationId": str(event.operation_id) if event.operation_id else None,
            "durationMs": event.duration_ms,
            "data": event.data,
            "createdAt": clock.iso(event.created_at),
        },
    }
