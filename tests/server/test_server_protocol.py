"""HaruHttpProtocol in-process: which connection makes room at the cap, and header bounds
across reads. (The real server with real sockets: test_server_edges.py.)"""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from uvicorn.server import ServerState

from fleets.server import protocol as edge
from fleets.server.limits import EdgeLimits

LIMITS = EdgeLimits(
    header_timeout_s=30,
    body_timeout_s=30,
    keepalive_timeout_s=30,
    max_header_bytes=8192,
    max_headers=16,
    max_connections=2,
)


class Transport:
    def __init__(self) -> None:
        self.closing = False
        self.aborted = False
        self.written = b""

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8700)}.get(name)

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.fixture
def limits(monkeypatch):
    monkeypatch.setattr(edge, "_LIMITS", LIMITS)


async def ok_app(scope, receive, send):
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


def server(app):
    config = uvicorn.Config(app, http=edge.HaruHttpProtocol, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()

    def connect() -> tuple[edge.HaruHttpProtocol, Transport]:
        protocol = edge.HaruHttpProtocol(config=config, server_state=state, app_state={})
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        return protocol, transport

    return connect


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_a_newcomer_past_the_cap_closes_the_longest_idle_connection(limits):
    connect = server(ok_app)
    (_, first), (second_p, second) = connect(), connect()
    second_p.data_received(GET)  # served: idle again, but more recently than `first`
    await asyncio.sleep(0.01)
    assert second_p.cycle.response_complete
    _, third = connect()
    assert first.closing and not second.closing and not third.closing


async def test_when_every_connection_is_busy_the_newcomer_is_refused(limits):
    release = asyncio.Event()

    async def hanging_app(scope, receive, send):
        await release.wait()
        await ok_app(scope, receive, send)

    connect = server(hanging_app)
    busy = [connect() for _ in range(2)]
    for protocol, _ in busy:
        protocol.data_received(GET)  # the app has not answered yet: a request in flight
    await asyncio.sleep(0.01)
    _, newcomer = connect()
    assert newcomer.aborted
    assert not any(t.closing for _, t in busy)
    release.set()
    await asyncio.sleep(0.01)


async def test_headers_arriving_in_small_reads_are_refused_once_past_the_limit(limits):
    connect = server(ok_app)
    protocol, transport = connect()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
    fed = 0
    while not transport.closing:
        protocol.data_received(b"a" * 1024)
        fed += 1024
        assert fed < 64 * 1024, "never refused"
    assert fed <= LIMITS.max_header_bytes + 1024
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert b'"headers_too_large"' in transport.written


async def test_headers_complete_in_one_read_are_measured_exactly(limits):
    connect = server(ok_app)
    small, small_t = connect()
    small.data_received(b"GET / HTTP/1.1\r\nX-A: " + b"a" * 4000 + b"\r\n\r\n")
    await asyncio.sleep(0.01)
    assert small_t.written.startswith(b"HTTP/1.1 200 ")
    big, big_t = connect()
    big.data_received(b"GET / HTTP/1.1\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n")
    assert big_t.written.startswith(b"HTTP/1.1 431 ") and big_t.closing


async def test_a_later_request_on_a_kept_alive_connection_moves_the_header_deadline(limits):
    connect = server(ok_app)
    protocol, _ = connect()
    first_deadline = protocol._header_deadline
    protocol.data_received(GET)
    await asyncio.sleep(0.01)
    protocol.data_received(b"GET /healthz HTTP/1.1\r\n")  # the next request begins
    assert protocol._header_deadline > first_deadline
