"""The lean ASGI app that serves the proxy's three endpoints ahead of Django.

Why not a Django view (measured by `bench/proxy.py --compare-django`): Django's ASGI handler
reads the whole request body (to a temporary file) before any view runs, so an oversized body
could not be refused "without reading past the limit"; and its middleware stack hops through a
thread per middleware (sync_to_async), which costs more than the proxy's whole added-latency
budget. This app reads the body itself, counted against HARU_CHAT_MAX_BODY_BYTES, touches no
session, cookie or CSRF state, and answers in the same error envelope as the API.

`manage.py serve` answers POST chat and completions before any ASGI message is built
(`fleets/server/direct.py`); this app serves them under any other ASGI server, and serves the
model listings always. Both run the same flow (`fleets/proxy/flow.py`).
"""

from __future__ import annotations

import asyncio

from fleets.proxy import drain, errors, flow, handler
from fleets.proxy.errors import ProxyError


def with_proxy(django_app):
    """Wrap Django's ASGI app so the proxy's paths never enter Django's middleware stack."""

    async def app(scope, receive, send):
        if scope["type"] == "http":
            if handler.endpoint_of(scope["path"]) is not None:
                return await proxy_app(scope, receive, send)
            if scope["path"] == drain.READYZ:
                return await drain.readyz(send)
        return await django_app(scope, receive, send)

    return app


async def proxy_app(scope, receive, send) -> None:
    """Serve POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/{model}]."""
    endpoint = handler.endpoint_of(scope["path"])
    # ASGI header names are lowercase bytes; a repeated name keeps its last value.
    headers = dict(scope["headers"])
    if endpoint in ("chat", "completions") and scope["method"] == "POST":
        return await flow.serve(AsgiIO(receive, send), headers, endpoint)
    exchange = handler.Exchange()
    try:
        if endpoint not in ("models", "model"):
            raise errors.method_not_allowed("POST")
        await _models(scope, headers, send, exchange)
    except ProxyError as err:
        exchange.outcome = err.code
        await AsgiIO(receive, send).respond(
            err.status, flow.error_headers(err, exchange.stale), err.body(), more=False
        )
    finally:
        exchange.record()


async def _models(scope, headers, send, exchange: handler.Exchange) -> None:
    if scope["method"] != "GET":
        raise errors.method_not_allowed("GET")
    handler.authorize(handler.text(headers.get(b"authorization")))
    path = scope["path"]
    if path.startswith(handler.MODEL_PREFIX):
        name = path[len(handler.MODEL_PREFIX) :]
        body = await handler.model_retrieve(name=name, headers=headers, exchange=exchange)
    else:
        body = await handler.models(headers=headers, exchange=exchange)
    out = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if exchange.stale:
        out.append(handler.STALE_HEADER)
    await send({"type": "http.response.start", "status": 200, "headers": out})
    await send({"type": "http.response.body", "body": body})


class AsgiIO:
    """flow.ClientIO over ASGI messages.

    A client that disconnects cancels the upstream request: a watcher task waits for the ASGI
    `http.disconnect` and cancels the forwarding task, whose cleanup closes the upstream
    connection, so the model server stops generating for nobody.
    """

    __slots__ = ("_receive", "_send", "_watcher", "done", "gone")

    def __init__(self, receive, send) -> None:
        self._receive = receive
        self._send = send
        self._watcher: asyncio.Task | None = None
        self.done = False  # the response is complete; a disconnect now changes nothing
        self.gone = False  # the client disconnected first

    async def read_body(self, limit: int) -> bytes | None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            return None
        body = message.get("body", b"")
        if not message.get("more_body", False):
            if len(body) > limit:
                raise errors.payload_too_large(limit)
            return body
        chunks, size = [body], len(body)
        while True:
            if size > limit:
                raise errors.payload_too_large(limit)
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                break
        if size > limit:
            raise errors.payload_too_large(limit)
        return b"".join(chunks)

    def watch(self) -> asyncio.Task:
        task = asyncio.current_task()
        assert task is not None  # the ASGI server runs each request in a task of its own
        self._watcher = asyncio.create_task(self._watch(task))
        return task

    def unwatch(self) -> None:
        self.done = True
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self, task: asyncio.Task) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self.done:
                    self.gone = True
                    task.cancel()
                return

    async def respond(self, status: int, headers, body: bytes, *, more: bool) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        if body or not more:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})

    async def write(self, chunk: bytes) -> None:
        # One ASGI message per upstream read: uvicorn writes it to the socket at once.
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self) -> None:
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def abort(self) -> None:
        # Returning without the final message makes the server drop the connection.
        pass
