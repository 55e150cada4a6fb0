"""Fixtures for the chat proxy: real servers on ephemeral ports, in the test's event loop.

Haru (`haru.asgi.application`) and two scriptable model-server doubles run under uvicorn on
sockets bound to port 0; the test talks to Haru over real TCP with httpx. The proxy reads the
state store on its own database thread, so these tests use committed data
(`django_db(transaction=True)`).
"""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from asgiref.sync import sync_to_async
from django.db import connections

from common.ports import free_port
from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.proxy import hold, store, upstream
from fleets.proxy.push import FEED
from fleets.proxy.snapshots import ROUTES
from fleets.server.protocol import HaruHttpProtocol
from fleets.services.layouts import layout_apply

CHAT = "/v1/chat/completions"


class FakeEngine:
    """A model server double: records every request and answers as scripted.

    Modes: "json" (one JSON body), "stream" (SSE chunks; the last one waits for `release`),
    "hang_headers" (never answers; counts the cancel), "hang_stream" (one chunk, then waits for
    the client to leave; counts the cancel), "redirect" (307 to /sleep). /sleep and /wake_up
    exist so a test can prove they are never reached.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = "json"
        self.status = 200
        self.requests: list[dict] = []
        self.release = asyncio.Event()
        self.finished = False
        self.cancelled = 0
        self.cancelled_event = asyncio.Event()
        self.control_hits = 0  # /sleep, /wake_up, /is_sleeping
        self.gate: asyncio.Event | None = None  # when set: answer only once it is set

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.requests.append(
            {
                "path": scope["path"],
                "query": scope["query_string"],
                "headers": dict(scope["headers"]),
                "body": body,
            }
        )
        if scope["path"] in ("/sleep", "/wake_up", "/is_sleeping"):
            self.control_hits += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.mode == "redirect":
            await send(
                {
                    "type": "http.response.start",
                    "status": 307,
                    "headers": [(b"location", b"/sleep?level=1"), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if self.mode == "hang_headers":
            await self._wait_for_cancel(receive)
            return
        if self.mode in ("stream", "hang_stream"):
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-engine", b"x")],
                }
            )
            await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
            if self.mode == "hang_stream":
                await self._wait_for_cancel(receive)
                return
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            self.finished = True
            return
        payload = json.dumps({"engine": self.name, "path": scope["path"]}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(payload)),
                    (b"connection", b"keep-alive"),
                    (b"x-engine", self.name.encode()),
                    (b"set-cookie", b"engine=1"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        self.finished = True

    async def _wait_for_cancel(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.cancelled += 1
        self.cancelled_event.set()


class Served:
    """An ASGI app under uvicorn on an ephemeral loopback port, in the running loop."""

    def __init__(self, app, http="auto") -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            http=http,
        )
        self.server = uvicorn.Server(config)

    async def start(self) -> Served:
        # startup() without serve(): no signal handlers, no 0.1 s main-loop tick to wait out.
        self.server.config.load()
        self.server.lifespan = self.server.config.lifespan_class(self.server.config)
        await self.server.startup(sockets=[self.sock])
        return self

    async def stop(self) -> None:
        """Close the listener and every connection; cancel what still runs (hung streams)."""
        for listener in self.server.servers:
            listener.close()
        for connection in list(self.server.server_state.connections):
            connection.shutdown()
        tasks = list(self.server.server_state.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for connection in list(self.server.server_state.connections):
            connection.transport.close()
        for listener in self.server.servers:
            await listener.wait_closed()
        self.sock.close()


@asynccontextmanager
async def serving(app, http="auto"):
    served = await Served(app, http).start()
    try:
        yield served
    finally:
        await served.stop()


def closed_port() -> int:
    """Return a loopback port nothing listens on."""
    return free_port()


@pytest.fixture(scope="session")
def event_loop_policy():
    """Run these tests on uvloop: the loop uvicorn picks in production (uvicorn[standard])."""
    import uvloop  # noqa: PLC0415 - optional: the test is skipped without it

    return uvloop.EventLoopPolicy()


@pytest.fixture(autouse=True)
async def proxy_isolation():
    """Start each test with a cold routing cache; release the loop's client and DB threads."""
    ROUTES.clear()
    yield
    ROUTES.clear()
    await FEED.stop()  # its listener connections belong to this test's loop
    await upstream.pool_close()
    # Closing here lets the test database be flushed and dropped (Postgres refuses to drop a
    # database that sessions are still connected to).
    await store.run(store.connection_close)
    await sync_to_async(connections.close_all)()


@pytest.fixture
def hold_settings(settings, monkeypatch):
    """Generous hold, and a poll bound so long that only the pushed change can wake in time."""

    def apply(**changes):
        settings.HARU = {**settings.HARU, **changes}

    apply(
        chat_hold_ms=30_000,
        chat_hold_poll_ms=10_000,
        chat_hold_max=1000,
        chat_hold_max_bytes=1 << 30,
    )
    monkeypatch.setattr(hold.HOLDS, "released", False)  # put back after a test's drain
    yield apply


@pytest.fixture
async def engines():
    """Two model-server doubles: east's and west's, on their own ports."""
    east, west = FakeEngine("east"), FakeEngine("west")
    async with serving(east) as e, serving(west) as w:
        east.url, west.url = e.url, w.url
        east.served, west.served = e, w
        yield {"east": east, "west": west}
        east.release.set()
        west.release.set()


@pytest.fixture
async def proxy_fleet(engines, layout_data):
    """Seed the two-domain example layout with every binding pointing at the doubles."""

    for domain in layout_data["domains"]:
        url = engines[domain["slug"]].url
        domain["servingBaseUrl"] = url
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                model["servingUrl"] = url

    def seed():
        layout_apply(layout=parse_layout(layout_data))
        return Fleet.objects.get(slug=layout_data["slug"])

    return await sync_to_async(seed)()


@pytest.fixture(params=["direct", "asgi"])
async def haru(request):
    """Haru's full ASGI app (proxy ahead of Django) on a real socket, and a client for it.

    Twice: under `manage.py serve`'s protocol, which answers POST chat and completions on the
    direct path (fleets/server/direct.py), and under uvicorn's own, where the ASGI app serves
    them (any other ASGI server): the two front doors must answer alike.
    """
    from haru.asgi import application  # noqa: PLC0415 - builds the app (and gc.freeze()s) at import: only once Django is set up for the test

    http = HaruHttpProtocol if request.param == "direct" else "auto"
    async with (
        serving(application, http) as served,
        httpx.AsyncClient(
            base_url=served.url, timeout=30, headers={"x-haru-fleet": "demo"}
        ) as client,
    ):
        client.served = served
        yield client


def chat_body(model: str = "qwen-small", **extra) -> bytes:
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]
