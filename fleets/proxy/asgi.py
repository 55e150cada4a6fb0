"""The lean ASGI app that serves the proxy's three endpoints ahead of Django.

Why not a Django view (measured by `bench/proxy.py --compare-django`): Django's ASGI handler
reads the whole request body (to a temporary file) before any view runs, so an oversized body
could not be refused "without reading past the limit"; and its middleware stack hops through a
thread per middleware (sync_to_async), which costs more than the proxy's whole added-latency
budget. This app reads the body itself, counted against HARU_CHAT_MAX_BODY_BYTES, touches no
session, cookie or CSRF state, and answers in the same error envelope as the API.

A client that disconnects cancels the upstream request: a watcher task waits for the ASGI
`http.disconnect` and cancels the forwarding task, whose cleanup closes the upstream
connection, so the model server stops generating for nobody.
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

from fleets.proxy import drain, errors, handler, upstream
from fleets.proxy.errors import ProxyError

log = logging.getLogger("haru.proxy")


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
    exchange = handler.Exchange()
    try:
        if endpoint in ("models", "model"):
            await _models(scope, headers, send, exchange)
        else:
            await _forward(scope, headers, receive, send, exchange, endpoint)
    except ProxyError as err:
        exchange.outcome = err.code
        await _send_error(send, err, stale=exchange.stale)
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


async def _forward(scope, headers, receive, send, exchange: handler.Exchange, endpoint) -> None:
    if scope["method"] != "POST":
        raise errors.method_not_allowed("POST")
    handler.authorize(handler.text(headers.get(b"authorization")))
    limit = settings.HARU["chat_max_body_bytes"]
    handler.check_content_length(handler.text(headers.get(b"content-length")), limit)
    body = await _read_body(receive, limit)
    if body is None:
        exchange.outcome = "client_disconnected"
        return

    state = _Watch()
    this_task = asyncio.current_task()
    assert this_task is not None  # an ASGI app always runs in a task
    watcher = asyncio.create_task(_watch_disconnect(receive, this_task, state))
    response: upstream.Response | None = None
    try:
        response = await handler.forward(
            headers=headers, body=body, endpoint=endpoint, exchange=exchange
        )
        headers_at = handler.perf()
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": handler.response_headers(response, exchange),
            }
        )
        if exchange.overhead is not None:  # set by forward() before it returns
            exchange.overhead += handler.perf() - headers_at
        try:
            async for chunk in response.aiter_raw():
                exchange.first_byte()
                # One ASGI message per upstream read: uvicorn writes it to the socket at once,
                # so each SSE event reaches the client as soon as the model server emits it.
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except upstream.UpstreamClosed as exc:
            # Headers are gone: the status cannot change. Ending without the final message
            # makes the server drop the connection, so the client sees a truncated response
            # rather than a complete-looking one.
            exchange.outcome = "upstream_stream_error"
            log.warning("model server for %r broke its stream: %s", exchange.model, exc)
            return
        state.done = True
        exchange.first_byte()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not state.gone:
            raise
        # Our watcher cancelled us because the client left: that is a normal end.
        this_task.uncancel()
        exchange.outcome = "client_disconnected"
    finally:
        state.done = True
        watcher.cancel()
        if response is not None:
            # Unread, this closes the upstream connection: the model server sees the cancel.
            await response.aclose()


class _Watch:
    __slots__ = ("done", "gone")

    def __init__(self) -> None:
        self.done = False  # the response is complete; a disconnect now changes nothing
        self.gone = False  # the client disconnected first


async def _watch_disconnect(receive, task: asyncio.Task, state: _Watch) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not state.done:
                state.gone = True
                task.cancel()
            return


async def _read_body(receive, limit: int) -> bytes | None:
    """Read the request body, refusing it once it passes `limit`; None if the client left."""
    message = await receive()
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
        message = await receive()
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


async def _send_error(send, err: ProxyError, *, stale: bool) -> None:
    body = err.body()
    out = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *err.headers,
    ]
    if stale:
        out.append(handler.STALE_HEADER)
    await send({"type": "http.response.start", "status": err.status, "headers": out})
    await send({"type": "http.response.body", "body": body})
