"""Hold and forward: a request the active cannot take now waits for a domain that can.

What holds a request (docs/proxy-hold.md): the model's own server refused the connection (no byte
of the request left Haru), it answered 503 (an explicit "not handled"), or the routing snapshot
says the model is bound on the active but cannot take traffic now (the active failed, a promotion
is under way). A held request waits for the routing change itself (`push.FEED`: Postgres NOTIFY,
Redis, or in-process), retries on a backoff that is bounded by HARU_CHAT_HOLD_POLL_MS while the
push channel is down, and is forwarded the first time an attempt succeeds. Bounds: each request
waits at most HARU_CHAT_HOLD_MS, and at most HARU_CHAT_HOLD_MAX requests holding at most
HARU_CHAT_HOLD_MAX_BYTES of bodies wait at once in this process; past either, 503 with
Retry-After. A client that leaves while held cancels its task, which frees
the slot at once (`Hold.close` in a finally).
"""

from __future__ import annotations

import time
from typing import NoReturn

from prometheus_client import Counter, Gauge, Histogram

from fleets.base.conf import haru_settings
from fleets.proxy import errors
from fleets.proxy.errors import ProxyError
from fleets.proxy.push import FEED

# While the push channel is up, the retry of a held request backs off up to this (the push wakes
# it the moment routing changes; the retry only catches a model server that came back in place).
RETRY_MAX_S = 1.0

HELD = Gauge(
    "haru_proxy_held",
    "Requests held now, waiting for a domain that can serve them.",
    multiprocess_mode="livesum",
)
HELD_TOTAL = Counter("haru_proxy_holds", "Requests that were held (each counted once).")
HOLD_SECONDS = Histogram(
    "haru_proxy_hold_seconds",
    "How long held requests waited, by how the hold ended.",
    ["outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)
RELEASED = Counter(
    "haru_proxy_hold_released",
    "Holds ended, by outcome: forwarded, expired, disconnected, refused_cap, drained, failed.",
    ["outcome"],
)


class Holds:
    """This process's held requests: the cap, and the drain that answers them all."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0  # request bodies kept in memory by held requests
        self.released = False  # a drain ended: every hold answers 503 now

    def admit(self, why: ProxyError, size: int) -> Hold:
        """Start holding one request of `size` body bytes, or raise: holding off, a cap
        reached (count or bytes), or draining."""
        config = haru_settings()
        hold_ms, cap = config.chat_hold_ms, config.chat_hold_max
        if not hold_ms or self.released:
            raise why
        if self.count >= cap or self.bytes + size > config.chat_hold_max_bytes:
            RELEASED.labels("refused_cap").inc()
            raise errors.hold_capacity(cap)
        self.count += 1
        self.bytes += size
        HELD.inc()
        HELD_TOTAL.inc()
        return Hold(self, why, hold_ms / 1000, size)

    def release_all(self) -> None:
        """End of a drain: wake every held request; each answers 503 with Retry-After."""
        self.released = True
        FEED.wake_all()


class Hold:
    """One held request: its deadline, its retry backoff, and how it ended."""

    __slots__ = ("_holds", "why", "started", "deadline", "_backoff", "_closed", "_size", "_seen")

    def __init__(self, holds: Holds, why: ProxyError, hold_s: float, size: int) -> None:
        self._holds = holds
        self._size = size
        self.why = why
        self.started = time.monotonic()
        self.deadline = self.started + hold_s
        self._backoff = 0.0
        self._closed = False
        self._seen = -1  # the newest pushed revision this hold already went again for

    async def wait(self, fleet_id: str, why: ProxyError, revision: int) -> None:
        """Wait for a routing change of `fleet_id` past `revision` (the snapshot the last
        attempt was routed on) or the next retry; raise when the hold ends."""
        self.why = why
        if self._holds.released:
            self._drained()
        # 0 (the pointer read on every request) still waits a little between retries.
        poll_s = max(haru_settings().chat_hold_poll_ms, 10) / 1000
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.close("expired")
            hold_ms = haru_settings().chat_hold_ms
            raise errors.hold_expired(
                f"held {hold_ms} ms (HARU_CHAT_HOLD_MS) and no domain could take it: {why.message}"
            )
        # Pushed while the request was out on its attempt (or reading the pointer), before it
        # waited: go again now, not at the next push, which may never come. Once per pushed
        # revision, so a revision the snapshot cannot load yet does not spin.
        pushed = FEED.revision(fleet_id)
        if pushed > revision and pushed > self._seen:
            self._seen = pushed
            return
        # Pushed: back off (the change wakes us anyway); polled: never longer than the bound.
        self._backoff = min(self._backoff * 2 or poll_s, RETRY_MAX_S) if FEED.up else poll_s
        await FEED.wait(fleet_id, min(remaining, self._backoff))
        if self._holds.released:
            self._drained()

    def _drained(self) -> NoReturn:
        self.close("drained")
        raise errors.draining(
            "this server is shutting down and no domain took the request in its drain budget"
        )

    def close(self, outcome: str) -> None:
        """Count the hold's end once (forwarded, expired, disconnected, drained)."""
        if self._closed:
            return
        self._closed = True
        self._holds.count -= 1
        self._holds.bytes -= self._size
        HELD.dec()
        RELEASED.labels(outcome).inc()
        HOLD_SECONDS.labels(outcome).observe(time.monotonic() - self.started)


HOLDS = Holds()
