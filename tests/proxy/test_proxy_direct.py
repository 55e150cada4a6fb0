"""The direct chat path of `manage.py serve` (fleets/server/direct.py), at the HTTP level.

Every proxy test that uses the `haru` fixture runs on both front doors; these pin what only the
direct path does by itself: which requests it takes from the ASGI app, and the HTTP details
uvicorn would otherwise handle (one write, keep-alive and `Connection: close`, pipelining,
`100 Continue`, chunked framing, the access log, a 500 for an unexpected error).
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from fleets.proxy import flow
from fleets.server.direct import ChatCycle
from fleets.server.protocol import HaruHttpProtocol
from tests.proxy.conftest import CHAT, chat_body, serving

pytestmark = pytest.mark.django_db(transaction=True)


async def teapot(scope, receive, send):
    """An ASGI app that answers everything 418: what reaches it did not take the direct path."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"asgi"})


def raw_request(path: str, body: bytes = b"", *, method: str = "POST", extra: str = "") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-haru-fleet: demo\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one response (content-length or chunked) off a kept-alive connection."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    assert headers.get("transfer-encoding") == "chunked", headers
    body = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readexactly(2)
            return status, headers, body
        body += (await reader.readexactly(size + 2))[:-2]


class Recording:
    """A transport that records what is written (uvloop's own cannot be patched)."""

    def __init__(self, transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(data)
        self._transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


async def connect(url: str):
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


@pytest.fixture
async def direct_only():
    """The teapot under manage.py serve's protocol: only the direct path answers like Haru."""
    async with serving(teapot, HaruHttpProtocol) as served:
        yield served


async def test_post_chat_and_completions_take_the_direct_path(direct_only, proxy_fleet):
    reader, writer = await connect(direct_only.url)
    try:
        for path in (CHAT, "/v1/completions"):
            writer.write(raw_request(path, chat_body()))
            status, _, body = await read_response(reader)
            # Not the teapot: the proxy answered (the doubles echo the path they were sent).
            assert status == 200, body
            assert json.loads(body)["path"] == path
        # Anything else, a GET on the chat path included, is the ASGI app's.
        for request in (
            raw_request(CHAT, method="GET"),
            raw_request("/v1/models", method="GET"),
            raw_request("/healthz", method="GET"),
        ):
            writer.write(request)
            status, _, body = await read_response(reader)
            assert (status, body) == (418, b"asgi")
    finally:
        writer.close()


async def test_a_complete_answer_goes_out_in_one_write_with_uvicorns_default_headers(
    direct_only, engines, proxy_fleet, monkeypatch
):
    writes: list[bytes] = []
    reader, writer = await connect(direct_only.url)
    try:
        writer.write(raw_request(CHAT, chat_body()))
        await read_response(reader)  # the connection's transport exists now: watch it
        (protocol,) = direct_only.server.server_state.connections
        # uvicorn's serve loop refreshes these each second (this harness runs no such loop).
        direct_only.server.server_state.default_headers = [
            (b"server", b"uvicorn"),
            (b"date", b"Tue, 01 Dec 2026 00:00:00 GMT"),
        ]
        monkeypatch.setattr(protocol, "transport", Recording(protocol.transport, writes))
        writer.write(raw_request(CHAT, chat_body()))
        status, headers, body = await read_response(reader)
    finally:
        writer.close()
    assert status == 200 and json.loads(body)["engine"] == "east"
    assert len(writes) == 1 and writes[0].endswith(body)
    assert headers["server"] == "uvicorn" and "date" in headers
    # The model server's own headers are filtered as on the ASGI path.
    assert headers["content-type"] == "application/json"
    assert "x-engine" not in headers and "set-cookie" not in headers
    assert headers["content-length"] == str(len(body))


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    direct_only, engines, proxy_fleet
):
    reader, writer = await connect(direct_only.url)
    try:
        writer.write(
            raw_request(CHAT, chat_body())
            + raw_request("/healthz", method="GET")
            + raw_request("/v1/completions", chat_body())
        )
        answers = [await read_response(reader) for _ in range(3)]
    finally:
        writer.close()
    assert [status for status, _, _ in answers] == [200, 418, 200]
    assert json.loads(answers[0][2])["path"] == CHAT
    assert json.loads(answers[2][2])["path"] == "/v1/completions"


async def test_http_1_0_and_connection_close_end_the_connection(direct_only, engines, proxy_fleet):
    for request in (
        raw_request(CHAT, chat_body()).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
        raw_request(CHAT, chat_body(), extra="connection: close\r\n"),
    ):
        reader, writer = await connect(direct_only.url)
        writer.write(request)
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await reader.read() == b""  # the server closed it
        writer.close()


async def test_expect_100_continue_is_answered_before_the_body(direct_only, engines, proxy_fleet):
    body = chat_body()
    reader, writer = await connect(direct_only.url)
    try:
        head = raw_request(CHAT, extra="expect: 100-continue\r\n").replace(
            b"content-length: 0", b"content-length: %d" % len(body)
        )
        writer.write(head)
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert status == 200 and json.loads(answer)["engine"] == "east"


async def test_a_stream_is_framed_chunked_and_each_event_is_sent_as_it_comes(
    direct_only, engines, proxy_fleet
):
    east = engines["east"]
    east.mode = "stream"
    reader, writer = await connect(direct_only.url)
    try:
        writer.write(raw_request(CHAT, chat_body(stream=True)))
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        assert b"transfer-encoding: chunked" in head and b"text/event-stream" in head
        received = b""
        while b"data: one" not in received:
            received += await reader.read(1024)
        # The first event arrived, framed, while the model server still holds the second.
        assert received == b"b\r\ndata: one\n\n\r\n"
        east.release.set()
        while not received.endswith(b"0\r\n\r\n"):
            received += await reader.read(1024)
    finally:
        writer.close()
    assert b"data: two\n\n" in received and b"data: [DONE]\n\n" in received


async def test_the_access_log_says_what_uvicorns_would(direct_only, engines, proxy_fleet):
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    access = logging.getLogger("uvicorn.access")
    level = access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        # uvicorn turns its access log on per connection when the logger has a handler.
        reader, writer = await connect(direct_only.url)
        writer.write(raw_request(CHAT, chat_body()))
        await read_response(reader)
        writer.close()
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert any('"POST /v1/chat/completions HTTP/1.1" 200' in line for line in lines), lines


async def test_an_unexpected_error_is_a_500_and_the_server_keeps_serving(
    direct_only, engines, proxy_fleet, monkeypatch, caplog
):
    real = flow.serve

    async def broken(io, headers, endpoint):
        raise RuntimeError("bug")

    monkeypatch.setattr(flow, "serve", broken)
    reader, writer = await connect(direct_only.url)
    writer.write(raw_request(CHAT, chat_body()))
    status, headers, body = await read_response(reader)
    assert (status, body, headers["connection"]) == (500, b"Internal Server Error", "close")
    assert await reader.read() == b""
    writer.close()
    assert "Exception in the chat path" in caplog.text
    monkeypatch.setattr(flow, "serve", real)
    reader, writer = await connect(direct_only.url)
    writer.write(raw_request(CHAT, chat_body()))
    status, _, _ = await read_response(reader)
    writer.close()
    assert status == 200


async def test_a_host_not_allowed_is_refused_before_the_proxy(
    direct_only, engines, proxy_fleet, settings
):
    # What the ASGI app's Host guard does (DNS rebinding), on the direct path too.
    settings.ALLOWED_HOSTS = ["haru.example.com"]
    reader, writer = await connect(direct_only.url)
    try:
        writer.write(raw_request(CHAT, chat_body()))  # Host: 127.0.0.1
        status, _, body = await read_response(reader)
        assert (status, json.loads(body)["error"]["code"]) == (400, "invalid_host")
        assert engines["east"].requests == []
        writer.write(raw_request(CHAT, chat_body()).replace(b"127.0.0.1", b"haru.example.com", 1))
        status, _, _ = await read_response(reader)
        assert status == 200
    finally:
        writer.close()


async def test_an_exact_chat_target_gets_the_lean_cycle_and_other_spellings_the_same_answer(
    direct_only, engines, proxy_fleet
):
    reader, writer = await connect(direct_only.url)
    try:
        seen = []
        for target in (CHAT, CHAT + "?trace=1", CHAT.replace("completions", "%63ompletions")):
            writer.write(raw_request(target, chat_body()))
            status, _, body = await read_response(reader)
            (protocol,) = direct_only.server.server_state.connections
            seen.append((status, json.loads(body)["path"], type(protocol.cycle) is ChatCycle))
    finally:
        writer.close()
    # Only the exact spelling skips uvicorn's URL parse and cycle; all three are served alike.
    assert seen == [(200, CHAT, True), (200, CHAT, False), (200, CHAT, False)]


async def test_a_body_that_comes_after_its_headers_is_waited_for(direct_only, engines, proxy_fleet):
    reader, writer = await connect(direct_only.url)
    try:
        request = raw_request(CHAT, chat_body())
        head, body = request.split(b"\r\n\r\n", 1)
        writer.write(head + b"\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the flow is waiting for the body by now
        writer.write(body[:5])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(body[5:])
        status, _, answer = await read_response(reader)
    finally:
        writer.close()
    assert status == 200 and json.loads(answer)["path"] == CHAT
