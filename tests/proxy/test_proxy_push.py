"""The pushed routing revision: real Postgres LISTEN/NOTIFY and real Redis pub/sub, and the poll.

Each channel counts as up only after its own ping came back; a revision published from another
connection (as the reconciler's process does) then wakes a waiter without any poll.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import redis
from asgiref.sync import sync_to_async
from django.db import connections
from django.dispatch import Signal

from common.ports import free_port
from fleets.proxy.push import FEED, RevisionFeed, parse
from fleets.services import route_publish
from fleets.services.route_publish import PG_CHANNEL, REDIS_CHANNEL, payload
from tests.proxy.test_proxy_routing import promote

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def feed():
    fresh = RevisionFeed()
    yield fresh
    await fresh.stop()


async def until(predicate, seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.02)


def test_payload_round_trips_and_garbage_is_ignored():
    assert parse(payload("f-1", 7)) == ("f-1", 7)
    assert parse("ping:abc") is None
    assert parse("nonsense") is None
    assert parse("x:" + "9" * 300) is None


async def test_publish_wakes_waiters_and_ignores_older_revisions(feed):
    feed.ensure_started()
    waiter = asyncio.create_task(feed.wait("f", 5))
    await asyncio.sleep(0)
    feed.publish("f", 3)
    assert await waiter is True
    assert feed.newer("f", 2) and not feed.newer("f", 3)
    waiter = asyncio.create_task(feed.wait("f", 0.2))
    await asyncio.sleep(0)
    feed.publish("f", 2)  # out of order: never goes backwards, wakes nobody
    assert feed.newer("f", 2) and not feed.newer("f", 3)
    assert await waiter is False


async def test_without_a_push_channel_nothing_is_up_and_waits_time_out(feed, settings):
    if connections["default"].vendor == "postgresql" or settings.HARU["redis_url"]:
        pytest.skip("a push channel is configured")
    feed.ensure_started()  # SQLite, no Redis: the bounded poll is all there is
    assert feed.up is False
    assert await feed.wait("f", 0.05) is False


@pytest.mark.postgres
async def test_postgres_notify_from_another_session_wakes_a_waiter(feed, settings):
    settings.HARU = {**settings.HARU, "redis_url": None}
    feed.ensure_started()
    await until(lambda: "postgres" in feed.channels_up())
    waiter = asyncio.create_task(feed.wait("fleet-a", 10))
    await asyncio.sleep(0.05)
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    with psycopg.connect(autocommit=True, **params) as other:  # the test database
        other.execute("SELECT pg_notify(%s, %s)", (PG_CHANNEL, payload("fleet-a", 42)))
    assert await asyncio.wait_for(waiter, 5) is True
    assert feed.newer("fleet-a", 41)


@pytest.mark.redis
async def test_redis_message_from_another_client_wakes_a_waiter(feed, settings):
    if not settings.HARU["redis_url"]:
        pytest.skip("needs REDIS_URL")
    feed.ensure_started()
    await until(lambda: "redis" in feed.channels_up())
    waiter = asyncio.create_task(feed.wait("fleet-b", 10))
    await asyncio.sleep(0.05)
    redis.Redis.from_url(settings.HARU["redis_url"]).publish(REDIS_CHANNEL, payload("fleet-b", 9))
    assert await asyncio.wait_for(waiter, 5) is True
    assert feed.newer("fleet-b", 8)


@pytest.mark.redis
async def test_a_redis_that_stops_takes_its_channel_down(feed, settings, tmp_path):
    """Redis stopped: the channel goes down (the poll takes over) and comes back with it."""
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("needs redis-server to run a private instance")
    port = free_port()
    argv = [server, "--port", str(port), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=tmp_path)
    try:
        settings.HARU = {**settings.HARU, "redis_url": f"redis://127.0.0.1:{port}/0"}
        if connections["default"].vendor == "postgresql":
            pytest.skip("the Postgres channel would keep the feed up")
        feed.ensure_started()
        await until(lambda: feed.up)
        proc.terminate()
        proc.wait(10)
        await until(lambda: not feed.up)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=tmp_path)
        await until(lambda: feed.up, 30)
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_route_switch_reaches_this_process_feed(monkeypatch):
    """The CAS's after-commit signal is heard by the process-wide FEED."""
    seen = []
    monkeypatch.setattr(FEED, "publish_threadsafe", lambda *args: seen.append(args))
    route_publish.route_committed.send(sender=None, fleet_id="f-1", revision=7)
    assert seen == [("f-1", 7)]


@pytest.mark.postgres
async def test_the_route_switch_notifies_listeners_when_it_commits(
    feed, settings, proxy_fleet, monkeypatch
):
    settings.HARU = {**settings.HARU, "redis_url": None}
    monkeypatch.setattr(route_publish, "route_committed", Signal())  # only the NOTIFY may wake it
    feed.ensure_started()
    await until(lambda: "postgres" in feed.channels_up())
    fleet_id = str(proxy_fleet.id)
    waiter = asyncio.create_task(feed.wait(fleet_id, 10))
    revision = await sync_to_async(promote)(proxy_fleet, "west")
    assert await asyncio.wait_for(waiter, 5) is True
    assert feed.newer(fleet_id, revision - 1) and not feed.newer(fleet_id, revision)


@pytest.mark.redis
async def test_the_route_switch_publishes_to_redis_after_commit(
    feed, settings, proxy_fleet, monkeypatch
):
    if connections["default"].vendor == "postgresql":
        pytest.skip("the NOTIFY would wake it too: this one is for Redis alone")
    monkeypatch.setattr(route_publish, "route_committed", Signal())  # only Redis may wake it
    feed.ensure_started()
    await until(lambda: "redis" in feed.channels_up())
    fleet_id = str(proxy_fleet.id)
    waiter = asyncio.create_task(feed.wait(fleet_id, 10))
    revision = await sync_to_async(promote)(proxy_fleet, "west")
    assert await asyncio.wait_for(waiter, 5) is True
    assert feed.newer(fleet_id, revision - 1)
