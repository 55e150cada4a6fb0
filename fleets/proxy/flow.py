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
from fleets.proxy import adapters, continuation, handler, upstream
from fleets.proxy.errors import ProxyError
from fleets.proxy.plan import Plan
from fleets.proxy.stream_ledger import Ledger

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
    plan = Plan(handler.request_document(body), body, endpoint)
    response: upstream.Response | None = None
    ledger: Ledger | None = None
    try:
        response = await _open(headers, body, endpoint, exchange, this_task, plan)
        headers_at = handler.perf()
        if plan.kept and response.status == 200 and exchange.route is not None:
            ledger = plan.ledger(exchange.route)
        # What already arrived goes out with the headers: for a plain completion that is
        # usually all of it, one write to the client.
        first = response.buffered()
        complete = response.complete
        if ledger is not None:
            first = ledger.feed(first)
            complete = complete and ledger.done
        if first or complete:
            exchange.first_byte()
        if complete:
            io.unwatch()
        out = handler.response_headers(response, exchange)
        if ledger is not None or plan.client_ids:
            out = [(n, v) for n, v in out if n != b"content-length"]  # the body changes
        if exchange.adapter is not None:
            # Answered under the adapter's name, with the version that answered first: what
            # follows (a continuation's too) goes through this connection.
            io, out = adapters.answering(io, out, exchange.adapter)
        await io.respond(response.status, out, first, more=not complete)
        if exchange.overhead is not None:  # set by forward() before it returns
            exchange.overhead += handler.perf() - headers_at
        if complete:
            return
        if ledger is None:
            await _relay(io, response, exchange)
            return
        if await _relay_kept(io, response, exchange, ledger, this_task):
            return
        await response.aclose()  # the cut upstream: closed before the continuation starts
        if not await continuation.resume(io, plan, ledger, headers, exchange, this_task):
            exchange.outcome = "upstream_stream_error"
            io.abort()
            return
        io.unwatch()
        await io.end()
    except asyncio.CancelledError:
        if not io.gone:
            raise
        # The client left (its front door cancelled us): a normal end.
        this_task.uncancel()
        exchange.outcome = "client_disconnected"
    finally:
        io.unwatch()
        if ledger is not None:
            ledger.release()
        if response is not None:
            # Unread, this closes the upstream connection: the model server sees the cancel.
            await response.aclose()


async def _open(
    headers: dict[bytes, bytes],
    body: bytes,
    endpoint: str,
    exchange: handler.Exchange,
    task: asyncio.Task,
    plan: Plan,
) -> upstream.Response:
    """Forward the request; return the response once its headers are in. A non-streamed answer
    that a sleep aborted is asked again (nothing of it was sent), up to the plan's re-runs."""
    while True:
        response = await handler.forward(
            headers=headers, body=body, endpoint=endpoint, exchange=exchange, task=task, plan=plan
        )
        if exchange.route is None or not plan.reruns_on(exchange.route) or not _aborted(response):
            return response
        plan.reruns += 1
        await response.aclose()


async def _relay(io: ClientIO, response: upstream.Response, exchange: handler.Exchange) -> None:
    """Stream the body through as it comes (a stream that cannot be continued)."""
    try:
        async for chunk in response.aiter_raw():
            exchange.chunk()
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


async def _relay_kept(
    io: ClientIO,
    response: upstream.Response,
    exchange: handler.Exchange,
    ledger: Ledger,
    task: asyncio.Task,
) -> bool:
    """Stream a kept stream through its ledger; True when it ended whole, False at a cut
    (reset, EOF before the end, silence past the bound, finish_reason "abort")."""
    watchdog = continuation.Watchdog(ledger, task.get_loop())
    watchdog.watch(response)
    try:
        async for chunk in response.aiter_raw():
            exchange.chunk()
            out = ledger.feed(chunk)
            if out:
                await io.write(out)
            if ledger.aborted:
                break
    except upstream.UpstreamClosed as exc:
        log.warning("model server for %r broke its stream: %s", exchange.model, exc)
    finally:
        watchdog.stop()
    if ledger.done and not ledger.aborted:
        io.unwatch()
        await io.end()
        return True
    return False


def _aborted(response: upstream.Response) -> bool:
    """Whether a non-streamed answer, read whole, is a sleep's abort (nothing sent yet)."""
    return (
        response.status == 200
        and response.complete
        and b'"finish_reason":"abort"' in response.peek()
    )
