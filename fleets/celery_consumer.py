"""Celery's worker consumer with a bounded reconnect backoff (CELERY_WORKER_CONSUMER).

Celery's consumer reconnects to a lost broker with kombu's default backoff (2 s, then 4, 6, ...
up to 30 s between attempts), so a worker came back 4-30 s after Redis did, and a promotion
accepted meanwhile waited that long (issue 11, finding 15). Reconnecting to a local Redis costs a
TCP handshake: this consumer retries every `RECONNECT_INTERVAL_MAX_S` at most.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

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
