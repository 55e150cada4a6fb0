"""Tell every proxy that a routing pointer moved: Postgres NOTIFY, Redis, and this process.

The proxies (fleets/proxy/push.py) wake held requests on it and stop reusing their cached
pointer. Delivery is best effort by design: a proxy that misses it still reads the pointer
within HARU_CHAT_HOLD_POLL_MS, so nothing here may fail the move.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.db import connection, transaction
from django.dispatch import Signal

from fleets.base.conf import haru_settings

log = logging.getLogger(__name__)

PG_CHANNEL = "haru_route"
REDIS_CHANNEL = "haru:route"
PUBLISH_TIMEOUT_S = 0.5

# Sent after commit with `fleet_id` and `revision` in the committing process; the proxy's feed
# connects to it (services never import the proxy).
route_committed = Signal()


def payload(fleet_id: str, revision: int) -> str:
    return f"{fleet_id}:{int(revision)}"


def revision_publish(fleet_id: str, revision: int) -> None:
    """Announce `revision` of `fleet_id`; call it inside the transaction that moved it.

    On Postgres the NOTIFY is part of that transaction: delivered exactly when it commits. The
    Redis message and the in-process hooks go out on commit. Never raises.
    """
    fleet_id = str(fleet_id)
    message = payload(fleet_id, revision)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PG_CHANNEL, message])
    transaction.on_commit(lambda: _after_commit(fleet_id, revision, message))


@functools.cache
def _redis(url: str) -> redis.Redis:
    # One client per URL and process: a publish reuses a pooled connection.
    return redis.Redis.from_url(
        url, socket_timeout=PUBLISH_TIMEOUT_S, socket_connect_timeout=PUBLISH_TIMEOUT_S
    )


def _after_commit(fleet_id: str, revision: int, message: str) -> None:
    # Robust: a receiver's failure must not fail the commit's caller.
    for receiver, outcome in route_committed.send_robust(
        sender=None, fleet_id=fleet_id, revision=revision
    ):
        if isinstance(outcome, Exception):
            log.warning("route change receiver %r failed", receiver, exc_info=outcome)
    url = haru_settings().redis_url
    if not url:
        return
    try:
        _redis(url).publish(REDIS_CHANNEL, message)
    except Exception:  # noqa: BLE001 - proxies fall back to their bounded poll
        log.warning("could not publish the route change of fleet %s to Redis", fleet_id)
