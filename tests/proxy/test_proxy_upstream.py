"""The upstream HTTP/1.1 client against byte-scripted servers: framing, reuse, failures.

What the proxy relies on, whoever does the HTTP: keep-alive reuse, unframed chunked bodies,
bytes passed through undecoded, the header timeout that never cuts a quiet stream, a hang-up
on the model server when the client goes away, nothing added or remembered (headers, cookies,
redirects), and https.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import resource
import socket
import ssl
import threading
import time
from contextlib import asynccontextmanager, suppress
from types import SimpleNamespace

import pytest
import trustme

from fleets.proxy import upstream
from fleets.proxy.errors import ProxyError
from fleets.proxy.snapshots import upstream_targets

BODY = b'{"model":"m"}'


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def event_loop_policy(request):
    """Run the client against both loops: transports differ in how they fail."""
    if request.param == "uvloop":
        import uvloop  # noqa: PLC0415 - optional: the test is skipped without it

        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@asynccontextmanager
async def raw_server(handle, *, scheme="http", ssl_context=None):
    """Serve `handle(reader, writer, connection_number)` on an ephemeral loopback port."""
    connections = []
    requests: list[bytes] = []

    async def on_connect(reader, writer):
        connections.append(writer)
        try:
            await handle(reader, writer, len(connections))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ssl_context)
    port = listener.sockets[0].getsockname()[1]
    target = upstream_targets(f"{scheme}://127.0.0.1:{port}")["chat"]
    try:
        yield SimpleNamespace(connections=connections, requests=requests, target=target)
    finally:
        listener.close()
        await upstream.pool_close()


async def read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


async def open_(server, headers=None, *, timeout_ms=5000) -> upstream.Response:
    head = upstream.request_head(server.target, headers or {}, len(BODY))
    return await upstream.open_stream(server.target, head, BODY, timeout_ms=timeout_ms, model="m")


async def hang_up(reader) -> None:
    """Return once the client closed or reset the connection."""
    with suppress(ConnectionError):
        await reader.read()


async def call(server, headers=None, *, timeout_ms=5000) -> tuple[int, bytes]:
    response = await open_(server, headers, timeout_ms=timeout_ms)
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


def serve_forever(reply: bytes, requests: list[bytes] | None = None):
    """A keep-alive server answering every request on a connection with `reply`."""

    async def handle(reader, writer, n):
        while True:
            try:
                request = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            if requests is not None:
                requests.append(request)
            writer.write(reply)

    return handle


async def test_keep_alive_connection_carries_several_requests():
    requests: list[bytes] = []
    async with raw_server(serve_forever(answer(b"ok"), requests)) as server:
        assert [await call(server) for _ in range(3)] == [(200, b"ok")] * 3
        assert len(server.connections) == 1
    for request in requests:
        assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert request.endswith(b"\r\n\r\n" + BODY)


async def test_concurrent_requests_each_get_their_own_response():
    async def handle(reader, writer, n):
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            await asyncio.sleep(0.01)  # all of them in flight at once
            writer.write(answer(b"conn %d" % n))

    async with raw_server(handle) as server:
        results = await asyncio.gather(*(call(server) for _ in range(40)))
        assert all(status == 200 for status, _ in results)
        # Nothing queues them: one connection each.
        assert len(server.connections) == 40
        assert sorted(body for _, body in results) == sorted(b"conn %d" % n for n in range(1, 41))


async def test_only_the_needed_headers_reach_the_model_server():
    requests: list[bytes] = []
    async with raw_server(serve_forever(answer(b"ok"), requests)) as server:
        await call(
            server,
            {
                b"authorization": b"Bearer haru",
                b"cookie": b"a=b",
                b"accept": b"text/event-stream",
                b"x-request-id": b"r1",
                b"host": b"haru.example",
                b"x-forwarded-for": b"10.1.1.1",
                b"x-evil": b"1\r\nInjected: yes",
            },
        )
        await call(server)
    port = server.target.port
    head = requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    fields = sorted(line.lower() for line in head[1:])
    assert fields == sorted(
        [
            b"host: 127.0.0.1:%d" % port,
            b"accept: text/event-stream",
            b"x-request-id: r1",
            b"content-type: application/json",
            b"accept-encoding: identity",
            b"user-agent: haru-proxy",
            b"content-length: %d" % len(BODY),
        ]
    )
    # Without client headers: no Accept: */* or compression that the client never asked for.
    bare = requests[1].split(b"\r\n\r\n")[0].lower()
    assert b"accept:" not in bare
    assert b"accept-encoding: identity" in bare


async def test_the_client_accept_encoding_and_content_type_pass_through():
    requests: list[bytes] = []
    async with raw_server(serve_forever(answer(b"ok"), requests)) as server:
        await call(server, {b"accept-encoding": b"gzip", b"content-type": b"application/x"})
    head = requests[0].lower()
    assert b"accept-encoding: gzip\r\n" in head and b"content-type: application/x\r\n" in head
    assert b"accept-encoding: identity" not in head


async def test_cookies_from_a_model_server_are_never_sent_back():
    requests: list[bytes] = []
    reply = answer(b"ok", b"set-cookie: session=abc; Path=/")
    async with raw_server(serve_forever(reply, requests)) as server:
        await call(server)
        await call(server)
    assert b"cookie" not in requests[1].lower()


async def test_redirects_are_returned_not_followed():
    requests: list[bytes] = []
    reply = (
        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /sleep?level=1\r\ncontent-length: 0\r\n\r\n"
    )
    async with raw_server(serve_forever(reply, requests)) as server:
        assert await call(server) == (307, b"")
    assert len(requests) == 1


async def test_chunked_body_is_unframed():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"hello world")


async def test_compressed_bodies_pass_through_undecoded():
    payload = gzip.compress(b'{"choices": []}' * 100)

    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(answer(payload, b"content-encoding: gzip", b"content-type: application/json"))

    async with raw_server(handle) as server:
        response = await open_(server, {b"accept-encoding": b"gzip"})
        body = b"".join([c async for c in response.aiter_raw()])
        await response.aclose()
    assert body == payload
    assert dict(upstream.response_headers(response)) == {
        b"content-encoding": b"gzip",
        b"content-type": b"application/json",
        b"content-length": b"%d" % len(payload),
    }


async def test_hop_by_hop_and_engine_headers_are_not_passed_back():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
            b"Keep-Alive: timeout=5\r\nServer: uvicorn\r\nSet-Cookie: a=b\r\nX-Request-Id: r9\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        )

    async with raw_server(handle) as server:
        response = await open_(server)
        assert b"".join([c async for c in response.aiter_raw()]) == b"ok"
        await response.aclose()
    assert upstream.response_headers(response) == [
        (b"content-type", b"text/event-stream"),
        (b"x-request-id", b"r9"),
    ]


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


async def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(answer(b"reply %d" % n))  # keep-alive promised, then closed (idle timeout)
        await writer.drain()

    async with raw_server(handle) as server:
        assert await call(server) == (200, b"reply 1")
        await asyncio.sleep(0.05)  # the server's FIN arrives
        assert await call(server) == (200, b"reply 2")
        assert len(server.connections) == 2


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


async def test_a_server_that_died_while_its_connection_was_idle_is_provably_not_sent_to():
    # The model server's process dies (its FIN is in the kernel before the loop has read it),
    # then a request comes: it must not go out on the dead connection (a failure after the write
    # could not be shown never to have started), but fail to connect: safe to hold and resend.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    die = threading.Event()

    def serve_once_then_die() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while BODY not in data:
                data += conn.recv(65536)
            conn.sendall(answer(b"ok"))  # keep-alive promised
            die.wait(10)
        listener.close()

    thread = threading.Thread(target=serve_once_then_die)
    thread.start()
    server = SimpleNamespace(target=upstream_targets(f"http://127.0.0.1:{port}")["chat"])
    try:
        assert await call(server) == (200, b"ok")
        die.set()
        thread.join(10)
        time.sleep(0.05)  # blocking on purpose: the loop must not see the FIN first
        with pytest.raises(upstream.NotStarted):
            await open_(server)
    finally:
        die.set()
        thread.join(10)
        await upstream.pool_close()


async def test_connections_are_reused_past_a_thousand_open_descriptors():
    # The staleness check must not refuse every connection of a busy server (select() cannot
    # watch a descriptor past 1023).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit ({hard}) is too low to pass 1024 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1100:
            filler.append(os.open(os.devnull, os.O_RDONLY))
        async with raw_server(serve_forever(answer(b"ok"))) as server:
            assert await call(server) == (200, b"ok")
            assert await call(server) == (200, b"ok")
            assert len(server.connections) == 1
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_idle_connections_are_retired_before_the_model_server_drops_them(monkeypatch):
    assert upstream.IDLE_EXPIRY_S < 5  # uvicorn's (so vLLM's, SGLang's) keep-alive timeout
    monkeypatch.setattr(upstream, "IDLE_EXPIRY_S", 0.05)
    async with raw_server(serve_forever(answer(b"ok"))) as server:
        await call(server)
        await asyncio.sleep(0.2)
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


async def test_a_chunked_body_cut_short_is_an_error():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
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


async def test_a_connection_closed_before_the_headers_is_unreachable():
    async def handle(reader, writer, n):
        await read_request(reader)

    async with raw_server(handle) as server:
        with pytest.raises(ProxyError) as caught:
            await call(server)
        assert caught.value.code == "upstream_unreachable"


async def test_no_headers_within_the_budget_times_out_and_hangs_up():
    hung_up = asyncio.Event()

    async def handle(reader, writer, n):
        await read_request(reader)
        await hang_up(reader)
        hung_up.set()

    async with raw_server(handle) as server:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(ProxyError) as caught:
            await call(server, timeout_ms=150)
        assert caught.value.code == "upstream_timeout"
        assert 0.14 <= loop.time() - began < 2
        await asyncio.wait_for(hung_up.wait(), 10)


async def test_a_stream_quiet_for_longer_than_the_header_budget_is_not_cut():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)  # a long pause mid-generation
        writer.write(b"6\r\n,later\r\n0\r\n\r\n")
        await writer.drain()

    async with raw_server(handle) as server:
        assert await call(server, timeout_ms=100) == (200, b"first,later")


async def test_a_large_body_survives_flow_control():
    payload = bytes(range(256)) * 8192  # 2 MiB, far past the read buffer's high-water mark

    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(answer(payload))
        await writer.drain()

    async with raw_server(handle) as server:
        response = await open_(server)
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
        await hang_up(reader)
        hung_up.set()

    async with raw_server(handle) as server:
        response = await open_(server)
        assert await anext(response.aiter_raw()) == b"one"
        await response.aclose()
        await asyncio.wait_for(hung_up.wait(), 10)


async def test_cancelling_while_waiting_for_headers_hangs_up_on_the_server():
    arrived, hung_up = asyncio.Event(), asyncio.Event()

    async def handle(reader, writer, n):
        await read_request(reader)
        arrived.set()
        await hang_up(reader)
        hung_up.set()

    async with raw_server(handle) as server:
        task = asyncio.create_task(call(server))
        await asyncio.wait_for(arrived.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(hung_up.wait(), 10)


# -- https ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A throwaway CA and a certificate for 127.0.0.1 that it signed.

    trustme writes the key-usage and key-identifier extensions that Python 3.13's
    VERIFY_X509_STRICT demands, so the same files verify on every supported Python.
    """
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    folder = tmp_path_factory.mktemp("tls")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(folder / "key.pem"))
    return folder


def server_tls(tls_files) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_files / "cert.pem", tls_files / "key.pem")
    return context


async def test_https_model_servers_are_reached_and_reused(tls_files, monkeypatch):
    def trusting():
        return ssl.create_default_context(cafile=str(tls_files / "ca.pem"))

    monkeypatch.setattr(upstream, "tls_context", trusting)
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\ntls \r\n2\r\nok\r\n0\r\n\r\n"
    )
    async with raw_server(
        serve_forever(chunked), scheme="https", ssl_context=server_tls(tls_files)
    ) as server:
        assert [await call(server) for _ in range(3)] == [(200, b"tls ok")] * 3
        assert len(server.connections) == 1


async def test_an_https_certificate_that_does_not_verify_is_unreachable(tls_files):
    async with raw_server(
        serve_forever(answer(b"no")), scheme="https", ssl_context=server_tls(tls_files)
    ) as server:
        with pytest.raises(ProxyError) as caught:
            await call(server)
        assert caught.value.code == "upstream_unreachable"


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
