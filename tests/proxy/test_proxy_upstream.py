"""The upstream HTTP/1.1 client against byte-scripted servers: framing, reuse, failures."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest

from fleets.proxy import upstream
from fleets.proxy.errors import ProxyError
from fleets.proxy.routing import upstream_targets

BODY = b'{"model":"m"}'


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def event_loop_policy(request):
    """Run the client against both loops: transports differ in how they fail."""
    if request.param == "uvloop":
        import uvloop

        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@asynccontextmanager
async def raw_server(handle):
    """Serve `handle(reader, writer, connection_number)` on an ephemeral loopback port."""
    connections = []

    async def on_connect(reader, writer):
        connections.append(writer)
        try:
            await handle(reader, writer, len(connections))
        finally:
            writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    target = upstream_targets(f"http://127.0.0.1:{port}")["chat"]
    try:
        yield SimpleNamespace(connections=connections, target=target)
    finally:
        listener.close()
        await upstream.pool_close()


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


async def call(server) -> tuple[int, bytes]:
    head = upstream.request_head(server.target, {}, len(BODY))
    response = await upstream.open_stream(server.target, head, BODY, timeout_ms=5000, model="m")
    try:
        return response.status, b"".join([c async for c in response.aiter_raw()])
    finally:
        await response.aclose()


def answer(body: bytes, *extra: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n"
        % (
            len(body),
            b"".join(h + b"\r\n" for h in extra),
        )
        + body
    )


async def test_keep_alive_connection_carries_several_requests():
    async def handle(reader, writer, n):
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert request.endswith(BODY)
            writer.write(answer(b"ok"))

    async with raw_server(handle) as server:
        assert [await call(server) for _ in range(3)] == [(200, b"ok")] * 3
        assert len(server.connections) == 1


async def test_chunked_body_is_unframed():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"hello world")


async def test_body_delimited_by_close_is_read_to_the_end():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"all of it")


async def test_informational_responses_are_skipped():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"final"))

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"final")


async def test_a_dropped_idle_connection_is_retried_on_a_fresh_one():
    async def handle(reader, writer, n):
        await read_request(reader)
        if n == 1:
            writer.write(answer(b"first"))
            await writer.drain()
            # Keep-alive promised, then the next request is dropped unanswered (the race with
            # a server's idle timeout).
            await reader.read(65536)
            return
        writer.write(answer(b"second"))

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"first")
        assert await call(server) == (200, b"second")
        assert len(server.connections) == 2


async def test_expired_idle_connections_are_not_reused(monkeypatch):
    monkeypatch.setattr(upstream, "IDLE_EXPIRY_S", 0)

    async def handle(reader, writer, n):
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(b"ok"))

    async with raw_server(handle) as server:
        await call(server)
        await call(server)
        assert len(server.connections) == 2


async def test_a_body_cut_short_is_an_error_not_a_short_success():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async with raw_server(handle) as server:
        with pytest.raises(upstream.UpstreamClosed):
            await call(server)


async def test_garbage_instead_of_a_response_is_unreachable():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()

    async with raw_server(handle) as server:
        with pytest.raises(ProxyError) as caught:
            await call(server)
        assert caught.value.code == "upstream_unreachable"


async def test_a_large_body_survives_flow_control():
    payload = bytes(range(256)) * 8192  # 2 MiB, well past the high-water mark

    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(answer(payload))
        await writer.drain()

    async with raw_server(handle) as server:
        head = upstream.request_head(server.target, {}, len(BODY))
        response = await upstream.open_stream(server.target, head, BODY, timeout_ms=5000, model="m")
        received = bytearray()
        async for chunk in response.aiter_raw():
            received += chunk
            await asyncio.sleep(0)  # a slow reader: the buffer fills and reading pauses
        await response.aclose()
        assert bytes(received) == payload


async def test_closing_an_unread_response_hangs_up_on_the_server():
    hung_up = asyncio.Event()

    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n")
        await writer.drain()
        await reader.read()  # returns at EOF: the client closed
        hung_up.set()

    async with raw_server(handle) as server:
        head = upstream.request_head(server.target, {}, len(BODY))
        response = await upstream.open_stream(server.target, head, BODY, timeout_ms=5000, model="m")
        assert await anext(response.aiter_raw()) == b"one"
        await response.aclose()
        await asyncio.wait_for(hung_up.wait(), 10)


def test_request_head_forwards_only_safe_headers():
    target = upstream_targets("http://10.0.0.5:8000/p")["chat"]
    head = upstream.request_head(
        target,
        {
            b"authorization": b"Bearer haru",
            b"cookie": b"a=b",
            b"accept": b"text/event-stream",
            b"x-request-id": b"r1",
            b"host": b"haru.example",
        },
        12,
    )
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /p/v1/chat/completions HTTP/1.1"
    assert b"host: 10.0.0.5:8000" in lines
    assert b"content-length: 12" in lines
    assert b"accept: text/event-stream" in lines and b"x-request-id: r1" in lines
    assert not any(line.startswith((b"authorization", b"cookie", b"host: haru")) for line in lines)
    assert head.endswith(b"\r\n\r\n")
