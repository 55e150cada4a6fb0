"""Failover does not depend on the broker: the server ticks itself while Redis is away
(issue 11, finding 15), and `serve --workers N` drives kicks in every worker."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from common.ports import free_port
from fleets.models import Operation
from fleets.reconciler import kick
from fleets.reconciler.loop import ReconcileLoop
from fleets.server.driver import RESUME_GRACE_S, BrokerFallback, start_for_server
from fleets.services.operations import operation_request


class RecordingLoop:
    def __init__(self) -> None:
        self.requested: list[tuple[str, int]] = []
        self.woken = 0

    def request(self, fleet_id: str, delay_ms: int = 0) -> None:
        self.requested.append((fleet_id, delay_ms))

    def wake(self) -> None:
        self.woken += 1


class Broker:
    def __init__(self) -> None:
        self.up = True
        self.queued: list[tuple[str, int]] = []

    def enqueue(self, fleet_id: str, delay_ms: int) -> None:
        if not self.up:
            raise ConnectionError("Connection refused")
        self.queued.append((fleet_id, delay_ms))

    def ping(self) -> bool:
        return self.up


def _fallback(loop, broker, now):
    return BrokerFallback(loop=loop, enqueue=broker.enqueue, probe=broker.ping, now=lambda: now[0])


def test_kicks_go_to_celery_while_the_broker_answers():
    loop, broker, now = RecordingLoop(), Broker(), [100.0]
    fallback = _fallback(loop, broker, now)
    fallback.kick("f1", 0)
    assert broker.queued == [("f1", 0)] and loop.requested == []
    assert fallback.probe_once() and not fallback.covering()


def test_a_kick_the_broker_refuses_runs_here_and_the_loop_covers_every_fleet():
    loop, broker, now = RecordingLoop(), Broker(), [100.0]
    fallback = _fallback(loop, broker, now)
    broker.up = False
    fallback.kick("f1", 0)
    assert loop.requested == [("f1", 0)]
    assert fallback.covering() and loop.woken == 1
    # While down, kicks skip the broker (no connect timeout per kick).
    broker.up = True  # (even if it would answer: the probe decides)
    fallback.kick("f2", 250)
    assert loop.requested[-1] == ("f2", 250) and broker.queued == []


def test_the_loop_keeps_covering_for_a_grace_after_the_broker_returns():
    loop, broker, now = RecordingLoop(), Broker(), [100.0]
    fallback = _fallback(loop, broker, now)
    broker.up = False
    assert not fallback.probe_once() and fallback.covering()
    broker.up = True
    now[0] += 15
    assert fallback.probe_once()
    # Back, but Celery's worker and beat may not have reconnected yet: keep ticking here.
    assert fallback.covering()
    fallback.kick("f1", 0)
    assert broker.queued == [("f1", 0)]  # kicks go to Celery again at once
    now[0] += RESUME_GRACE_S + 0.1
    assert not fallback.covering()


def test_a_worker_without_a_probe_skips_the_broker_briefly_and_never_covers():
    loop, broker, now = RecordingLoop(), Broker(), [100.0]
    fallback = BrokerFallback(loop=loop, enqueue=broker.enqueue, probe=None, now=lambda: now[0])
    broker.up = False
    fallback.kick("f1", 0)
    assert loop.requested == [("f1", 0)] and not fallback.covering()
    broker.up = True
    now[0] += 5
    fallback.kick("f2", 0)
    assert broker.queued == [("f2", 0)]


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own on a free port, so the test may stop it."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return proc
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    procs = [start()]

    class Handle:
        url = f"redis://127.0.0.1:{port}/0"

        def stop(self) -> None:
            procs[-1].kill()
            procs[-1].wait(10)

        def restart(self) -> None:
            procs.append(start())

    yield Handle()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.postgres
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_promote_accepted_while_redis_is_down_starts_at_once(seeded_fleet, hosts, own_redis):
    # A real Redis of the test's own, stopped; the server's loop with a long interval, so only
    # the kick falling back to this process can start the promotion soon.
    client = redis.Redis.from_url(own_redis.url, socket_connect_timeout=1, socket_timeout=2)

    def enqueue(fleet_id: str, delay_ms: int) -> None:
        client.lpush("haru-test-ticks", fleet_id)  # a publish, as far as the broker can tell

    holder: list[BrokerFallback] = []
    loop = ReconcileLoop(interval_ms=60_000, periodic=lambda: holder[0].covering())
    fallback = BrokerFallback(loop=loop, enqueue=enqueue, probe=lambda: bool(client.ping()))
    holder.append(fallback)
    loop.start()
    fallback.start()
    kick.drive(kick.TickDriver(fallback.kick))
    try:
        own_redis.stop()
        started = time.monotonic()
        op = operation_request(
            fleet=seeded_fleet, kind="promote", target_domain_id=_west(seeded_fleet)
        ).operation
        while Operation.objects.get(pk=op.pk).state == "pending":
            assert time.monotonic() - started < 5, "the promotion did not start without Redis"
            time.sleep(0.05)
        waited = time.monotonic() - started
        assert fallback.covering()
        own_redis.restart()
        while fallback._down_since is not None:
            assert time.monotonic() - started < 15, "the probe never saw Redis come back"
            time.sleep(0.1)
        fallback.kick(str(seeded_fleet.id), 0)
        assert client.lrange("haru-test-ticks", 0, -1) == [str(seeded_fleet.id).encode()]
    finally:
        fallback.stop()
        loop.stop()
    print(f"promotion started {waited:.2f} s after it was accepted with Redis down")
    assert waited < 3.0


def _west(fleet):
    return fleet.domains.get(slug="west").id


@pytest.mark.django_db(transaction=True)  # the loop's thread lists the fleets
@pytest.mark.parametrize(
    ("role", "periodic", "kicks_here"),
    [("single", True, True), ("parent", True, False), ("worker", False, True)],
)
def test_without_a_broker_each_server_process_has_its_part(role, periodic, kicks_here):
    haru = {**settings.HARU, "redis_url": None, "reconcile_interval_ms": 60_000}
    kick.drive(None)
    with override_settings(HARU=haru):
        driver = start_for_server(role=role)
    try:
        assert driver.loop is not None and driver.fallback is None
        assert driver.loop._periodic() is periodic
        chosen = kick.driver()
        assert (chosen is not None and chosen.kick == driver.loop.request) is kicks_here
    finally:
        driver.stop()


@pytest.mark.django_db(transaction=True)
def test_with_a_broker_only_the_ticking_process_probes_and_covers(own_redis):
    haru = {**settings.HARU, "redis_url": own_redis.url, "reconcile_interval_ms": 60_000}
    with override_settings(HARU=haru):
        parent = start_for_server(role="parent")
        worker = start_for_server(role="worker")
    try:
        assert parent.fallback is not None and worker.fallback is not None
        assert parent.fallback._probe is not None and worker.fallback._probe is None
        assert worker.loop is not None and worker.loop._periodic() is False
        chosen = kick.driver()
        assert chosen is not None and chosen.kick == worker.fallback.kick
    finally:
        worker.stop()
        parent.stop()
