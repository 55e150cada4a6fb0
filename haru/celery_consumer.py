"""Celery's worker consumer with a bounded reconnect backoff (CELERY_WORKER_CONSUMER).

Celery's consumer reconnects to a lost broker with kombu's default backoff (2 s, then 4, 6, ...
up to 30 s between attempts), so a worker came back 4-30 s after Redis did, and a promotion
accepted meanwhile waited that long (issue 11, finding 15). Reconnecting to a local Redis costs a
TCP handshake: this consumer retries every `RECONNECT_INTERVAL_MAX_S` at most.

It also keeps the worker alive when the broker is lost while it holds unacknowledged messages
(an ETA tick waiting in the worker, a task running with acks_late): see `_closing_quietly`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

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
