"""The forwarding flow of one chat or completions request, over any client transport.

Two front doors run it: the ASGI app (`fleets/proxy/asgi.py`: any ASGI server, the tests'
in-process servers) and the direct path of `manage.py serve` (`fleets/server/direct.py`:
uvicorn's parsed request, answered on the socket without ASGI messages). They differ only in
how bytes come in and go out, which is what `ClientIO` names; everything the client can see
(status, headers, errors, holding, streaming, what ends a request) is decided here, once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from fleets.base.conf import haru_settings
from fleets.proxy import handler, upstream
from fleets.proxy.errors import ProxyError

log = logging.getLogger("haru.proxy")

Headers = list[tuple[bytes, bytes]]


class ClientIO(Protocol):
    """One client connection's side of one request."""

    gone: bool  # the client disconnected while the request was being served

    async def read_body(self, limit: int) -> bytes | None:
        """The whole request body, refused (413) once past `limit`; None if the client left."""
        ...

    def watch(self) -> asyncio.Task:
        """From now on a client disconnect sets `gone` and cancels the task serving this
        request; return that task."""
        ...

    def unwatch(self) -> None:
        """The response is complete: a disconnect from now on changes nothing."""
        ...

    async def respond(self, status: int, headers: Headers, body: bytes, *, more: bool) -> None:
        """Send the status, the headers and the body so far; `more=False` ends the response."""
        ...

    async def write(self, chunk: bytes) -> None:
        """Send one more piece of the body, as soon as it came."""
        ...

    async def end(self) -> None:
        """End a response sent with `more=True`."""
        ...

    def abort(self) -> None:
        """Drop the connection mid-body: the client sees a truncated response."""
        ...


async def serve(io: ClientIO, headers: dict[bytes, bytes], endpoint: str) -> None:
    """Serve POST /v1/chat/completions or /v1/completions (`endpoint`: chat, completions)."""
    exchange = handler.Exchange()
    try:
        await _forward(io, headers, endpoint, exchange)
    except ProxyError as err:
        exchange.outcome = err.code
        await io.respond(err.status, error_headers(err, exchange.stale), err.body(), more=False)
    finally:
        exchange.record()


def error_headers(err: ProxyError, stale: bool) -> Headers:
    body = err.body()
    out = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *err.headers,
    ]
    if stale:
        out.append(handler.STALE_HEADER)
    return out


async def _forward(
    io: ClientIO, headers: dict[bytes, bytes], endpoint: str, exchange: handler.Exchange
) -> None:
    handler.authorize(handler.text(headers.get(b"authorization")))
    limit = haru_settings().chat_max_body_bytes
    handler.check_content_length(handler.text(headers.get(b"content-length")), limit)
    body = await io.read_body(limit)
    if body is None:
        exchange.outcome = "client_disconnected"
        return

    this_task = io.watch()
    response: upstream.Response | None = None
    try:
        response = await handler.forward(
            headers=headers, body=body, endpoint=endpoint, exchange=exchange, task=this_task
        )
        headers_at = handler.perf()
        # What already arrived goes out with the headers: for a plain completion that is
        # usually all of it, one write to the client.
        first = response.buffered()
        complete = response.complete
        if first or complete:
            exchange.first_byte()
        if complete:
            io.unwatch()
        out = handler.response_headers(response, exchange)
        await io.respond(response.status, out, first, more=not complete)
        if exchange.overhead is not None:  # set by forward() before it returns
            exchange.overhead += handler.perf() - headers_at
        if complete:
            return
        try:
            async for chunk in response.aiter_raw():
                exchange.first_byte()
                # One write per upstream read, at once: each SSE event reaches the client as
                # soon as the model server emits it.
                await io.write(chunk)
        except upstream.UpstreamClosed as exc:
            # Headers are gone: the status cannot change. Dropping the connection without the
            # end of the body shows the client a truncated response, not a complete-looking one.
            exchange.outcome = "upstream_stream_error"
            log.warning("model server for %r broke its stream: %s", exchange.model, exc)
            io.abort()
            return
        io.unwatch()
        exchange.first_byte()
        await io.end()
    except asyncio.CancelledError:
        if not io.gone:
            raise
        # The client left (its front door cancelled us): a normal end.
        this_task.uncancel()
        exchange.outcome = "client_disconnected"
    finally:
        io.unwatch()
        if response is not None:
            # Unread, this closes the upstream connection: the model server sees the cancel.
            await response.aclose()
