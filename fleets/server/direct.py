"""The chat path of `manage.py serve`: POST chat and completions answered on the socket.

Under `HaruHttpProtocol` a POST to /v1/chat/completions or /v1/completions never becomes ASGI
messages. uvicorn has parsed the request (headers, the body as it arrives, keep-alive,
pipelining, flow control, the edge's deadlines and limits) into a request cycle (for a target
spelled exactly, this module's lean `ChatCycle` instead of uvicorn's own); this module runs the
proxy's flow (`fleets/proxy/flow.py`) on that cycle directly and writes the answer as bytes,
the head and a complete body in one write. What that saves, per request, is the ASGI
layer's own work: the app chain (Channels' router, the Host guard, the proxy dispatch), a dict
per message and its checks, a separate write for the headers, and the task that watches for a
disconnect (here the connection's loss cancels the request itself). `bench/proxy.py` measures
it (CPU per request, against a bare asyncio relay); every other path, and these two under any
other ASGI server, are served by the ASGI app (`fleets/proxy/asgi.py`), with the same flow.

Kept as uvicorn does it: the access log line, `Connection: close` when the connection will
not be kept, chunked framing when the length is not known, `100 Continue`, a 500 for an
unexpected error before the response started and a dropped connection after.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from uvicorn.server import ServerState

from common.private_apis import (
    STATUS_LINE,
    FlowControl,
    RequestResponseCycle,
    get_client_addr,
    get_path_with_query_string,
)
from fleets.proxy import errors, flow, handler
from fleets.server import hosts

log = logging.getLogger("haru.proxy")

# The paths served here: POST only (anything else goes to the ASGI app, which answers 405).
ENDPOINTS = {path: name for path, name in handler.ENDPOINTS.items() if name != "models"}
# The same, as the raw request target: a request whose target is exactly one of these gets a
# ChatCycle (below) without its URL parsed; any other spelling (a query string, an escaped
# character) is parsed by uvicorn and still served here, on uvicorn's cycle.
TARGETS = {path.encode("ascii"): name for path, name in ENDPOINTS.items()}

_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class Connection(Protocol):
    """What the chat path needs of its connection (protocol.py's HaruHttpProtocol)."""

    @property
    def transport(self) -> asyncio.Transport: ...
    @property
    def flow(self) -> FlowControl: ...
    @property
    def access_logger(self) -> logging.Logger: ...
    @property
    def access_log(self) -> bool: ...
    @property
    def server_state(self) -> ServerState: ...
    @property
    def expect_100_continue(self) -> bool: ...

    # The chat request being served on this connection, told when the connection is lost.
    direct: CycleIO | None

    def on_response_complete(self) -> None: ...


class LazyEvent:
    """asyncio.Event's set, clear and wait for the cycle's one waiter (CycleIO.read_body), with
    no future unless the body is still to come when the flow asks for it (it rarely is)."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if not self._set:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return True


class ChatCycle:
    """uvicorn's RequestResponseCycle for a chat request: the state its protocol and CycleIO
    read and write, in slots, with a LazyEvent; no ASGI app runs on it.

    uvicorn's cycle costs more than a microsecond per request to build (a dozen attributes,
    an asyncio.Event, the URL parsed first), a percent or two of the chat path's CPU.
    """

    __slots__ = (
        "access_log",
        "access_logger",
        "body",
        "default_headers",
        "disconnected",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: Connection,
        scope: Any,
        *,
        keep_alive: bool,
    ) -> None:
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.access_logger = protocol.access_logger
        self.access_log = protocol.access_log
        self.default_headers = protocol.server_state.default_headers
        self.message_event = LazyEvent()
        self.on_response = protocol.on_response_complete
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = protocol.expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False


Cycle = RequestResponseCycle | ChatCycle


def endpoint_of(cycle: Cycle) -> str | None:
    """The endpoint this module serves for the cycle's request, else None."""
    scope = cycle.scope
    if scope["method"] != "POST":
        return None
    return ENDPOINTS.get(scope["path"])


async def serve(io: CycleIO, endpoint: str) -> None:
    """Serve one request; never raises (as uvicorn's run_asgi, which this replaces here)."""
    cycle = io.cycle
    try:
        if hosts.refused(cycle.scope["headers"]):
            await io.respond(400, hosts.REFUSED_HEADERS, hosts.REFUSED_BODY, more=False)
            return
        # ASGI header names are lowercase; a repeated name keeps its last value.
        await flow.serve(io, dict(cycle.scope["headers"]), endpoint)
    except BaseException as exc:  # as uvicorn's run_asgi: log it, answer 500 or drop
        log.error("Exception in the chat path", exc_info=exc)
        if not cycle.response_started and not cycle.disconnected:
            cycle.response_started = True
            cycle.transport.write(_500)
        cycle.transport.close()
    finally:
        # The flow has unwatched already; forget this request on the connection.
        if io.protocol.direct is io:
            io.protocol.direct = None


class CycleIO:
    """flow.ClientIO on uvicorn's request cycle and transport."""

    __slots__ = ("_chunked", "_watched", "cycle", "gone", "protocol", "task")

    def __init__(self, protocol: Connection, cycle: Cycle) -> None:
        self.protocol = protocol
        self.cycle = cycle
        # The task serving the request, set by the protocol that starts it (asking the loop
        # for the current task is a system call per request on Python 3.11: getpid).
        self.task: asyncio.Task | None = None
        self._watched = False
        self._chunked = False
        self.gone = False

    async def read_body(self, limit: int) -> bytes | None:
        cycle = self.cycle
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        # on_body appends to cycle.body and sets the event; on_message_complete clears
        # more_body; a disconnect (or the edge's refusal) sets `disconnected`.
        while cycle.more_body and not cycle.disconnected:
            if len(cycle.body) > limit:
                raise errors.payload_too_large(limit)
            cycle.flow.resume_reading()
            await cycle.message_event.wait()
            cycle.message_event.clear()
        if cycle.disconnected:
            return None
        if len(cycle.body) > limit:
            raise errors.payload_too_large(limit)
        body = bytes(cycle.body)
        cycle.body = bytearray()
        return body

    def watch(self) -> asyncio.Task:
        assert self.task is not None  # set when the protocol started it
        self._watched = True
        self.protocol.direct = self
        return self.task

    def unwatch(self) -> None:
        self._watched = False

    def client_left(self) -> None:
        """The connection is lost (the protocol calls this): end what is being served."""
        if self._watched and self.task is not None:
            self._watched = False
            self.gone = True
            self.task.cancel()

    async def respond(self, status: int, headers: flow.Headers, body: bytes, *, more: bool) -> None:
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        if cycle.access_log:
            cycle.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(cycle.scope),
                cycle.scope["method"],
                get_path_with_query_string(cycle.scope),
                cycle.scope["http_version"],
                status,
            )
        # Headers here are the proxy's own or the model server's as its parser accepted them
        # (no CR or LF can be in them), filtered to a fixed set of names.
        content = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            content += (name, b": ", value, b"\r\n")
        length_known = False
        for name, value in headers:
            if name == b"content-length":
                length_known = True
            elif name == b"connection" and value == b"close":
                cycle.keep_alive = False
                continue  # written once, below
            content += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        if not length_known and status not in (204, 304):
            self._chunked = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        if body:
            content += (b"%x\r\n" % len(body), body, b"\r\n") if self._chunked else (body,)
        if not more:
            if self._chunked:
                content.append(b"0\r\n\r\n")
            cycle.transport.write(b"".join(content))
            self._complete()
            return
        cycle.transport.write(b"".join(content))

    async def write(self, chunk: bytes) -> None:
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected or not chunk:
            return
        if self._chunked:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        else:
            cycle.transport.write(chunk)

    async def end(self) -> None:
        cycle = self.cycle
        if cycle.disconnected:
            return
        if self._chunked:
            cycle.transport.write(b"0\r\n\r\n")
        self._complete()

    def abort(self) -> None:
        self.cycle.transport.close()

    def _complete(self) -> None:
        cycle = self.cycle
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()
