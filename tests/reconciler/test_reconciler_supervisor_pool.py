"""The supervisor calls' connection pool, sharded by origin (supervisor/deadline.py): every
supervisor's connection kept alive from one call to the next at fleet-farm sizes, where one
httpx pool (20 kept) would open a new connection for every call."""

from __future__ import annotations

import httpcore
import httpx

from common.private_apis import set_transport_pool
from fleets.reconciler.supervisor.deadline import (
    KEEPALIVE_EXPIRY_S,
    KEEPALIVE_PER_SHARD,
    ShardedPool,
)
from supervisor.settings import settings_from_env

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class CountingBackend(httpcore.MockBackend):
    """Answers every request on a connection (up to 8) with `{}`; counts connections made."""

    def __init__(self) -> None:
        super().__init__([ANSWER] * 8)
        self.connects: list[tuple[str, int]] = []

    def connect_tcp(self, host, port, *args, **kwargs):  # noqa: ANN001 - httpcore's signature
        self.connects.append((host, port))
        return super().connect_tcp(host, port, *args, **kwargs)


def _client(backend: CountingBackend, shards: int) -> httpx.Client:
    transport = httpx.HTTPTransport()
    pool = ShardedPool(httpx.create_ssl_context(), backend, shards)
    set_transport_pool(transport, pool)  # as DeadlineTransport does
    return httpx.Client(transport=transport)


def test_every_supervisor_keeps_its_connection_between_calls_at_farm_sizes():
    backend = CountingBackend()
    origins = [f"http://127.0.{i // 250}.{i % 250 + 1}:8701" for i in range(600)]
    with _client(backend, shards=64) as client:
        for _ in range(3):
            for origin in origins:
                assert client.get(f"{origin}/v1/status").json() == {}
    # One connection per supervisor, reused by the second and third round.
    assert len(backend.connects) == len(origins)


def test_one_pool_alone_reconnects_once_past_what_it_keeps():
    backend = CountingBackend()
    origins = [f"http://127.0.1.{i + 1}:8701" for i in range(KEEPALIVE_PER_SHARD + 8)]
    with _client(backend, shards=1) as client:
        for _ in range(2):
            for origin in origins:
                client.get(f"{origin}/v1/status")
    assert len(backend.connects) > len(origins)  # the bound holds: some were let go


def test_a_kept_connection_is_let_go_before_the_supervisor_closes_it():
    # Reused as the supervisor closes it, a connection loses the heartbeat sent on it (a 10 s
    # gap at the 5 s interval, seen at 100 fleets when this was 60 s).
    edge = settings_from_env({"HARU_SUPERVISOR_CONFIG": "unused.json"}).edge
    assert edge.keepalive_timeout_s - 0.5 >= KEEPALIVE_EXPIRY_S
