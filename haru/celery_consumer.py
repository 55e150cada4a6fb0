"""Celery's worker consumer with a bounded reconnect backoff (CELERY_WORKER_CONSUMER).

Celery's consumer reconnects to a lost broker with kombu's default backoff (2 s, then 4, 6, ...
up to 30 s between attempts), so a worker came back 4-30 s after Redis did, and a promotion
accepted meanwhile waited that long (issue 11, finding 15). Reconnecting to a local Redis costs a
TCP handshake: this consumer retries every `RECONNECT_INTERVAL_MAX_S` at most.

It also keeps the worker alive when the broker is lost while it holds unacknowledged messages
(an ETA tick waiting in the worker, a task running with acks_late): see `_closing_quietly` for
the clean-up of the lost connection, and `_settling_quietly` for the late acknowledgement of a
task that was running when the broker went away and ends after it returned (issue 29). Both are
upstream defects worked around here; docs/tick-lease.md ("Upstream report") has the report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Message

log = logging.getLogger(__name__)

RECONNECT_INTERVAL_START_S = 0.25
RECONNECT_INTERVAL_STEP_S = 0.25
RECONNECT_INTERVAL_MAX_S = 1.0


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn: Any) -> Any:
        # Celery passes no intervals to kombu's ensure_connection (its defaults apply); add ours.
        ensure = conn.ensure_connection

        def bounded(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("interval_start", RECONNECT_INTERVAL_START_S)
            kwargs.setdefault("interval_step", RECONNECT_INTERVAL_STEP_S)
            kwargs.setdefault("interval_max", RECONNECT_INTERVAL_MAX_S)
            return ensure(*args, **kwargs)

        conn.ensure_connection = bounded
        return super().ensure_connected(conn)

    def call_soon_ack(self, p: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Every late ack and reject of a task message comes through here (Celery's Request
        # calls the promise built in `create_task_handler`); the event loop runs it later.
        return super().call_soon_ack(_settling_quietly(p), *args, **kwargs)

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        # Celery closes the connection it drops here; that close must not end the worker.
        if self.connection is not None:
            self.connection.close = _closing_quietly(self.connection.close)
        super().on_connection_error_after_connected(exc)


def _closing_quietly(close: Callable[[], Any]) -> Callable[[], None]:
    """Wrap a lost connection's close so kombu's failed restore does not end the worker.

    Celery collects the lost connection, which detaches its transport, then closes it. When a
    channel's close failed during the collect (a BRPOP or subscription in flight on the dead
    socket), the close after it restores that channel's unacknowledged messages through the
    detached transport and raises AttributeError (`conninfo.hostname` of None), which Celery's
    `ignore_errors` lets through: "Unrecoverable error", exit 1 (the fault suite's Redis
    outage). The broker being gone, the restore could not run anyway; the messages stay in its
    unacked set for the visibility timeout, as after any failed restore.
    """

    def quietly() -> None:
        try:
            close()
        except AttributeError:
            log.warning("consumer: the lost broker connection's clean-up failed", exc_info=True)

    return quietly


def _settling_quietly(settle: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a message's ack or reject so a message of a dropped connection cannot end the worker.

    A task running with acks_late when the broker went away keeps its message, which belongs to
    the connection Celery dropped on the loss (`on_connection_error_after_connected` collects it,
    which detaches its transport). When the task ends, its ack runs in the event loop: the
    message's channel, whose client pool the clean-up had closed, builds a new pool from the
    detached transport's connection info and raises AttributeError (`conninfo.hostname` of
    None). Kombu's `ack_log_error` catches connection errors only, so the error leaves the event
    loop: "Unrecoverable error", exit 1, once Redis is back. The ack cannot be sent through a
    connection that no longer exists; the message is then either gone with the broker (a
    restarted Redis without persistence) or still in its unacked set, redelivered after the
    visibility timeout like any unacknowledged message (the tasks are idempotent).
    """
    message = getattr(settle, "__self__", None)
    if not isinstance(message, Message):
        return settle

    def quietly(*args: Any, **kwargs: Any) -> Any:
        try:
            return settle(*args, **kwargs)
        except AttributeError:
            if not _of_a_dropped_connection(message):
                raise
            log.warning(
                "consumer: the %s of a task received before the broker connection was lost "
                "could not be sent (that connection is gone); the broker redelivers the task "
                "after its visibility timeout if it still holds it",
                settle.__name__.removesuffix("_log_error"),
            )
            return None

    return quietly


def _of_a_dropped_connection(message: Message) -> bool:
    # kombu's Connection.collect() sets the transport's `client` to None: a channel whose
    # transport lost its client belongs to a connection that was collected.
    transport = getattr(message.channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None
