"""The routing revision pushed to the proxy: who wakes held requests, and when reads may be skipped.

A routing change reaches this process three ways, whichever is up:
- Postgres `LISTEN haru_route` on a dedicated async psycopg connection (the pointer CAS sends
  `NOTIFY` in its own transaction, so a notification exists exactly when the move committed);
- the Redis channel `haru:route` (published after commit) when REDIS_URL is set;
- in-process, when the CAS ran in this very process (the embedded reconcile loop, tests).

A channel counts as up only once a ping sent through it came back: a pooler that accepts LISTEN
but never delivers (PgBouncer in transaction mode) never turns it on. The ping repeats every
PING_EVERY_S; a missed echo takes the channel down and reconnects. Nothing here is trusted for
correctness alone: the routing cache still reads the pointer at least every
HARU_CHAT_HOLD_POLL_MS (the bounded poll), and a push only makes the change visible sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable

import psycopg
import redis.asyncio as aioredis
from django.db import connections
from django.dispatch import receiver

from fleets.base.conf import haru_settings
from fleets.services.route_publish import PG_CHANNEL, REDIS_CHANNEL, route_committed
from fleets.services.route_publish import payload as payload

log = logging.getLogger("haru.proxy")

PING_EVERY_S = 5.0
ECHO_WITHIN_S = 2.0
CONNECT_TIMEOUT_S = 2.0
RETRY_MIN_S, RETRY_MAX_S = 0.5, 10.0
_PING = "ping:"


def parse(message: str) -> tuple[str, int] | None:
    """Read `fleet_id:revision`; None for anything else (pings, garbage)."""
    fleet_id, sep, revision = message.rpartition(":")
    if not sep or not fleet_id or len(message) > 200 or not revision.isdigit():
        return None
    return fleet_id, int(revision)


class RevisionFeed:
    """The newest routing revision seen per fleet in this process, and who waits for a change."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._revisions: dict[str, int] = {}
        self._changed: dict[str, asyncio.Future[None]] = {}
        self._up: set[str] = set()  # channels whose ping came back
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = threading.Lock()

    @property
    def up(self) -> bool:
        return bool(self._up)

    def channels_up(self) -> set[str]:
        return set(self._up)

    def ensure_started(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the running loop's listeners once (the proxy runs with lifespan off: lazily);
        `loop` is the running loop, if the caller has it."""
        if loop is None:
            loop = asyncio.get_running_loop()
        if self.loop is loop:
            return
        with self._lock:
            self.loop = loop
            self._revisions.clear()
            self._changed.clear()
            self._up.clear()
            self._tasks = []
        for name, listen in _listeners():
            self._tasks.append(loop.create_task(self._keep(name, listen), name=f"push-{name}"))

    async def stop(self) -> None:
        """Stop this loop's listeners (tests, shutdown); another loop's are only forgotten."""
        tasks, self._tasks = self._tasks, []
        if self.loop is asyncio.get_running_loop():
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._up.clear()
        self.loop = None

    def revision(self, fleet_id: str) -> int:
        """The newest revision pushed for `fleet_id` (-1: none yet)."""
        return self._revisions.get(fleet_id, -1)

    def newer(self, fleet_id: str, revision: int) -> bool:
        """Whether a revision past `revision` was pushed for `fleet_id`."""
        return self._revisions.get(fleet_id, -1) > revision

    def publish(self, fleet_id: str, revision: int) -> None:
        """Record a committed revision and wake whoever waits on the fleet (loop thread)."""
        if revision <= self._revisions.get(fleet_id, -1):
            return
        if len(self._revisions) > 100_000:  # fleet ids come from the store: bounded anyway
            self._revisions.clear()
        self._revisions[fleet_id] = revision
        waiting = self._changed.pop(fleet_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def wake_all(self) -> None:
        """Wake every waiter without a change (a drain ending): each re-checks why it waits."""
        waiting, self._changed = self._changed, {}
        for future in waiting.values():
            if not future.done():
                future.set_result(None)

    def publish_threadsafe(self, fleet_id: str, revision: int) -> None:
        """Publish from any thread (the CAS's on_commit); a no-op with no loop running."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(self.publish, fleet_id, revision)

    async def wait(self, fleet_id: str, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a pushed change of `fleet_id`; True if one came."""
        loop = asyncio.get_running_loop()
        future = self._changed.get(fleet_id)
        if future is None or future.done() or future.get_loop() is not loop:
            future = self._changed[fleet_id] = loop.create_future()
        try:
            # Shielded: one waiter timing out must not cancel the others' future.
            async with asyncio.timeout(max(0.0, timeout_s)):
                await asyncio.shield(future)
        except TimeoutError:
            return False
        return True

    async def _keep(self, name: str, listen: Callable[[RevisionFeed, str], Awaitable[None]]):
        """Run one channel's listener forever, reconnecting with a capped backoff."""
        delay = RETRY_MIN_S
        while True:
            try:
                await listen(self, name)
            except asyncio.CancelledError:
                self._up.discard(name)
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: poll meanwhile, reconnect
                if name in self._up:
                    log.warning(
                        "routing push via %s is down (%s); polling", name, type(exc).__name__
                    )
                    delay = RETRY_MIN_S
            self._up.discard(name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _mark_up(self, name: str) -> None:
        if name not in self._up:
            log.info("routing push via %s is up", name)
        self._up.add(name)

    def _received(self, name: str, message: str, nonce: str, echoed: asyncio.Event) -> None:
        if message == _PING + nonce:
            echoed.set()
            return
        parsed = parse(message)
        if parsed is not None:
            self.publish(*parsed)


class _Pinger:
    """Ping through a channel every PING_EVERY_S; raise when an echo does not come back."""

    def __init__(self, feed: RevisionFeed, name: str) -> None:
        self.feed, self.name = feed, name
        self.nonce = secrets.token_hex(8)
        self.echoed = asyncio.Event()

    async def run(self, send: Callable[[str], Awaitable[object]]) -> None:
        while True:
            self.echoed.clear()
            await send(_PING + self.nonce)
            async with asyncio.timeout(ECHO_WITHIN_S):
                await self.echoed.wait()
            self.feed._mark_up(self.name)
            await asyncio.sleep(PING_EVERY_S)

    def received(self, message: str) -> None:
        self.feed._received(self.name, message, self.nonce, self.echoed)


async def _listen_postgres(feed: RevisionFeed, name: str) -> None:
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    params.setdefault("connect_timeout", int(CONNECT_TIMEOUT_S))
    async with asyncio.timeout(CONNECT_TIMEOUT_S * 2):
        conn = await psycopg.AsyncConnection.connect(autocommit=True, **params)
    loop = asyncio.get_running_loop()
    nonce = secrets.token_hex(8)
    echoed = asyncio.Event()
    try:
        await conn.execute(f"LISTEN {PG_CHANNEL}")
        while True:
            # One connection does both: statements run between the notifies() rounds.
            echoed.clear()
            await conn.execute("SELECT pg_notify(%s, %s)", (PG_CHANNEL, _PING + nonce))
            echo_by, next_ping = loop.time() + ECHO_WITHIN_S, loop.time() + PING_EVERY_S
            while (now := loop.time()) < next_ping:
                if not echoed.is_set() and now >= echo_by:
                    raise ConnectionError("no echo of our ping: LISTEN is not delivered")
                until = next_ping if echoed.is_set() else echo_by
                async for notify in conn.notifies(timeout=until - now):
                    feed._received(name, notify.payload, nonce, echoed)
                    if echoed.is_set():
                        feed._mark_up(name)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


async def _listen_redis(feed: RevisionFeed, name: str) -> None:
    url = haru_settings().redis_url
    assert url is not None  # listened to only with Redis configured (channels() below)
    client = aioredis.Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=None,  # the subscription waits indefinitely; the ping bounds it
    )
    publisher = aioredis.Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=CONNECT_TIMEOUT_S,
    )
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pinger = _Pinger(feed, name)
        await pubsub.subscribe(REDIS_CHANNEL)

        async def send(message: str) -> None:
            await publisher.publish(REDIS_CHANNEL, message)

        async def receive() -> None:
            async for message in pubsub.listen():
                data = message.get("data")
                if message.get("type") == "message" and isinstance(data, bytes):
                    pinger.received(data.decode("utf-8", "replace"))

        await _race(pinger.run(send), receive())
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
        with contextlib.suppress(Exception):
            await client.aclose()
        with contextlib.suppress(Exception):
            await publisher.aclose()


async def _race(*coros: Awaitable[None]) -> None:
    """Run both until the first ends; re-raise its failure (a listener never ends cleanly)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        raise ConnectionError("push channel ended")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _listeners() -> list[tuple[str, Callable[[RevisionFeed, str], Awaitable[None]]]]:
    out: list[tuple[str, Callable[[RevisionFeed, str], Awaitable[None]]]] = []
    if connections["default"].vendor == "postgresql":
        out.append(("postgres", _listen_postgres))
    if haru_settings().redis_url:
        out.append(("redis", _listen_redis))
    return out


FEED = RevisionFeed()


@receiver(route_committed, dispatch_uid="haru-proxy-feed")
def _route_committed(sender: object, *, fleet_id: str, revision: int, **_kwargs: object) -> None:
    # A move committed in this very process (the embedded reconcile loop, tests) reaches it
    # directly.
    FEED.publish_threadsafe(fleet_id, revision)
