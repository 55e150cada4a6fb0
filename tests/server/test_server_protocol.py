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
    max_body_bytes=4096,
    max_connections=2,
    max_connections_per_address=1000,
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
    monkeypatch.setattr(edge.HaruHttpProtocol, "edge_limits", staticmethod(lambda: LIMITS))


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


# ---------------------------------------------------------------------------------------------
# The body cap (LIMITS.max_body_bytes = 4096).


class Recorder:
    """An app that reads the whole body (recording each message) and then answers 200."""

    def __init__(self) -> None:
        self.calls = 0
        self.messages: list[dict] = []

    async def __call__(self, scope, receive, send):
        self.calls += 1
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if self.messages[-1]["type"] == "http.disconnect":
            return
        await ok_app(scope, receive, send)

    @property
    def received(self) -> int:
        return sum(len(m.get("body", b"")) for m in self.messages)


def post(length: int) -> bytes:
    return b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED = b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_a_declared_body_over_the_cap_is_refused_413_before_the_app_runs(limits):
    app = Recorder()
    protocol, transport = server(app)()
    protocol.data_received(post(300 * 1024 * 1024) + b"x" * 1000)
    await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert b'"request_too_large"' in transport.written
    assert b"HARU_HTTP_MAX_BODY_BYTES (4096 bytes)" in transport.written
    assert transport.closing
    assert app.calls == 0
    assert protocol.cycle is None  # no request was started, so nothing of the body was kept


async def test_a_declared_body_at_the_cap_is_served_whole(limits):
    app = Recorder()
    protocol, transport = server(app)()
    protocol.data_received(post(4096) + b"x" * 4096)
    await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    assert app.received == 4096 and not transport.closing


async def test_a_chunked_body_under_the_cap_is_served_whole(limits):
    app = Recorder()
    protocol, transport = server(app)()
    protocol.data_received(CHUNKED)
    for _ in range(4):
        protocol.data_received(chunk(b"y" * 1000))
        await asyncio.sleep(0)
    protocol.data_received(b"0\r\n\r\n")
    await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    assert app.received == 4000 and not transport.closing


async def test_a_chunked_body_is_cut_413_at_the_read_that_passes_the_cap(limits):
    app = Recorder()
    protocol, transport = server(app)()
    protocol.data_received(CHUNKED)
    fed = 0
    while not transport.closing:
        protocol.data_received(chunk(b"z" * 700))
        fed += 700
        await asyncio.sleep(0)  # the app reads what has arrived so far
        assert fed < 64 * 1024, "never cut"
    assert fed <= 4096 + 700  # one read past the cap, no more
    await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 413 ")
    assert b'"request_too_large"' in transport.written
    assert app.messages[-1]["type"] == "http.disconnect"  # the app learnt it was cut
    assert app.received <= 4096  # the chunk that crossed the cap never reached it


async def test_a_chunked_body_past_the_cap_after_the_app_answered_is_closed_without_413(limits):
    async def answers_at_once(scope, receive, send):
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no", "more_body": True})
        await asyncio.sleep(3600)  # still streaming its answer

    protocol, transport = server(answers_at_once)()
    protocol.data_received(CHUNKED)
    await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 401 ")
    answered = len(transport.written)
    protocol.data_received(chunk(b"z" * 5000))
    assert transport.closing
    assert len(transport.written) == answered  # no second status line on the socket
    assert protocol.cycle.disconnected
