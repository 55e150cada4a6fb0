"""uvicorn's httptools protocol with deadlines and limits at every phase of a connection.

uvicorn bounds only the idle time between two requests (`timeout_keep_alive`): a client that
opens a connection and sends nothing, trickles its headers or its body, or sends 50 MB of
headers, is kept and buffered for as long as it likes. This subclass adds, per connection:

- a header deadline: from the connection's opening (or a request's first byte, on a kept-alive
  connection) to the end of its headers; past it the connection is closed;
- a body deadline: from the end of the headers to the end of the body; past it 408 (or a close,
  if the app already answered), and the app's `receive()` sees a disconnect;
- a size limit on the request line plus headers, and a count limit on headers: 431, checked as
  bytes arrive, so at most one read past the limit is ever buffered;
- a size limit on the request body: a declared Content-Length over it is answered 413 as soon
  as the headers end, before any of the body is read (the app never runs); a chunked body is
  counted as it is parsed and cut at the first read that passes the limit (413, or a close if
  the app already answered; the app sees a disconnect). An app's own, finer body limit (the
  chat proxy's, the supervisor API's 64 KiB) stays below this one;
- the keep-alive idle limit (uvicorn's, set from the limits, on one lazy timer per connection);
- a cap on connections per process. A new connection past the cap closes the connection that
  has waited longest for a request (idle: no request being read or answered). Idle connections
  cost the attacker nothing, so refusing newcomers instead would let a flood of them lock out
  `/healthz` and every real client for a whole header deadline; closing an idle connection
  costs its owner one reconnect. Only when every connection is busy is the newcomer refused.

Everything else (parsing, the ASGI cycle, WebSocket upgrade, pipelining, flow control) is
uvicorn's. The header deadline and the keep-alive limit are one lazy timer each per connection
(a request moves a deadline), and a body that arrives with its headers, the usual case, needs
no timer at all (bench/server_edges.py measures the edge's cost).

Served as it is by the supervisor (`protocol_with`, supervisor/server.py) and subclassed by the
control plane's server with its chat direct path (fleets/server/protocol.py, through
`edge_limits` and `_own_cycle`).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, ClassVar

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from common.edge.limits import EdgeLimits
from common.private_apis import HttpToolsProtocol

__all__ = ["EdgeHttpProtocol", "protocol_with"]


class _Idle:
    """The connections of one server waiting for a request, oldest first."""

    def __init__(self) -> None:
        # A dict keeps insertion order: the first key has waited longest.
        self.waiting: dict[EdgeHttpProtocol, None] = {}

    def oldest(self, other_than: EdgeHttpProtocol) -> EdgeHttpProtocol | None:
        for protocol in self.waiting:
            if protocol is not other_than:
                return protocol
        return None


_IDLE: weakref.WeakKeyDictionary[ServerState, _Idle] = weakref.WeakKeyDictionary()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; the refusal is on the protocol."""


# Connection phases, as far as the deadlines care.
_HEADERS, _BODY, _OTHER = "headers", "body", "other"


_stock_on_body = HttpToolsProtocol.on_body
_stock_on_headers_complete = HttpToolsProtocol.on_headers_complete


class EdgeHttpProtocol(HttpToolsProtocol):
    # The limits every connection of this class serves with (`protocol_with` sets them), and
    # the setting a 413 names.
    LIMITS: ClassVar[EdgeLimits | None] = None
    BODY_LIMIT_SETTING: ClassVar[str] = "the edge's body limit"

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = self.edge_limits()
        self.timeout_keep_alive = self.limits.keepalive_timeout_s  # type: ignore[assignment]
        idle = _IDLE.get(server_state)
        if idle is None:
            idle = _IDLE[server_state] = _Idle()
        self._idle = idle
        self._phase = _HEADERS
        # One lazy timer per connection for the header deadline: a request on a kept-alive
        # connection moves the deadline (a float) instead of creating and cancelling a timer
        # per request; the timer re-arms itself for what is left when it fires early.
        self._header_deadline = 0.0
        self._header_timer: asyncio.TimerHandle | None = None
        # The keep-alive idle limit the same way: uvicorn arms a timer after every response
        # and cancels it when the next request arrives, one created and cancelled per request.
        # None while a request is in flight.
        self._idle_deadline: float | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0  # raw bytes received in the current header phase
        self._body_bytes = 0  # body bytes parsed for the current request
        self._max_body_bytes = self.limits.max_body_bytes  # read per body chunk: one lookup
        self._chunk = 0  # length of the read being parsed
        self._refusal: tuple[int, str, str] | None = None

    @classmethod
    def edge_limits(cls) -> EdgeLimits:
        """The limits a new connection serves with (read once per connection)."""
        if cls.LIMITS is None:
            raise RuntimeError(f"{cls.__name__} has no limits: build it with protocol_with()")
        return cls.LIMITS

    # Connection life.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        self._header_timer = self.loop.call_at(self._header_deadline, self._header_timeout)
        self._idle.waiting[self] = None
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        victim = self._idle.oldest(other_than=self)
        if victim is None:
            # Every other connection is serving a request: this one is the one too many.
            self._forget()
            self.transport.abort()
            return
        victim._forget()
        victim.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    def _forget(self) -> None:
        self._idle.waiting.pop(self, None)
        self._idle_deadline = None
        for timer in (self._header_timer, self._body_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._keepalive_timer = None

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport over with its own ping deadlines.
        self._forget()
        super().handle_websocket_upgrade()

    # Reading.

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        self._chunk = len(data)
        if self._phase is _HEADERS:
            self._header_bytes += self._chunk
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        if self._phase is _HEADERS and self._header_bytes > self.limits.max_header_bytes:
            # Headers still incomplete and already too long: refuse before buffering more.
            self._refuse(431, "headers_too_large", self._too_large_message())
        elif self._phase is _BODY and self._body_timer is None and not self.transport.is_closing():
            # Only a body that did not come with its headers needs a timer.
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timeout)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is not _HEADERS:
            # A request on a kept-alive connection (or pipelined): a fresh header deadline,
            # and a raw count that starts with the whole read it began in (over-counting a
            # pipelined predecessor's tail errs on the safe side).
            self._phase = _HEADERS
            self._header_bytes = self._chunk
            self._header_deadline = self.loop.time() + self.limits.header_timeout_s
            if self._header_timer is None:
                self._header_timer = self.loop.call_at(self._header_deadline, self._header_timeout)

    def on_headers_complete(self) -> None:
        self._idle.waiting.pop(self, None)
        # Checked once the headers are parsed, and only when the raw count says they might be
        # too long: the raw check in data_received already bounds what can be buffered.
        if len(self.headers) > self.limits.max_headers:
            self._stop(431, "too_many_headers", f"more than {self.limits.max_headers} headers")
        if self._header_bytes > self.limits.max_header_bytes:
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > self.limits.max_header_bytes:
                self._stop(431, "headers_too_large", self._too_large_message())
        self._body_bytes = 0
        for name, value in self.headers:
            if name == b"content-length":
                # The parser has checked it is one plain decimal number. Refused here, before
                # uvicorn starts the app: nothing of the body is read or buffered.
                if int(value) > self._max_body_bytes:
                    self._stop(413, "request_too_large", self._body_too_large_message())
                break
        # Set only now: a refusal above belongs to the header phase (no cycle of its own yet).
        self._phase = _BODY
        if not self._own_cycle():
            _stock_on_headers_complete(self)

    def _own_cycle(self) -> bool:
        """Start a request cycle of a subclass's own for the request whose headers just ended
        and return True, or return False, having done nothing, to leave it to uvicorn."""
        return False

    def on_body(self, body: bytes) -> None:
        # Counted for every body: a declared length cannot be passed (the parser ends the
        # message there), so this only ever cuts a chunked one, at the read that crosses the
        # limit, before the chunk joins what the app is yet to receive.
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body_bytes:
            self._stop(413, "request_too_large", self._body_too_large_message())
        _stock_on_body(self, body)  # not super(): this runs per body read, on the chat path

    def on_message_complete(self) -> None:
        self._phase = _OTHER
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, with the lazy keep-alive timer (__init__) in place of one per request.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        # Nothing in flight: the connection is idle until the next request's first bytes.
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive
        if self._keepalive_timer is None:
            self._keepalive_timer = self.loop.call_at(self._idle_deadline, self._keepalive_due)
        self._idle.waiting[self] = None

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when bytes arrive and when the connection is lost.
        self._idle_deadline = None

    def _keepalive_due(self) -> None:
        self._keepalive_timer = None
        deadline = self._idle_deadline
        if deadline is None:
            return  # a request came; the next response arms a timer again
        if self.loop.time() < deadline:
            # Idle again since (a later response moved the deadline): wait for what is left.
            self._keepalive_timer = self.loop.call_at(deadline, self._keepalive_due)
            return
        self.timeout_keep_alive_handler()

    # Refusals and deadlines.

    def _too_large_message(self) -> str:
        return f"request line and headers exceed {self.limits.max_header_bytes} bytes"

    def _body_too_large_message(self) -> str:
        return (
            f"request body exceeds {self.BODY_LIMIT_SETTING} ({self.limits.max_body_bytes} bytes)"
        )

    def _stop(self, status: int, code: str, message: str) -> None:
        self._refusal = (status, code, message)
        raise _Refused(message)

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer `status` unless the app already answered, then close the connection."""
        self._forget()
        # Only in the body phase is uvicorn's cycle the refused request's own (in the header
        # phase it is still the previous request's, or none).
        cycle = self.cycle if self._phase is _BODY else None
        self._phase = _OTHER
        answered = cycle is not None and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            # The app is serving this request: its receive() returns a disconnect now, and
            # whatever it sends later is dropped (uvicorn's send ignores a disconnected cycle),
            # so nothing of it can follow the refusal on the socket.
            cycle.disconnected = True
            cycle.message_event.set()
        if not self.transport.is_closing():
            if not answered:
                self.transport.write(_error_response(status, code, message))
            self.transport.close()

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._phase is not _HEADERS or self.transport.is_closing():
            return  # the next request's on_message_begin arms it again
        left = self._header_deadline - self.loop.time()
        if left > 0:
            # The deadline moved (a later request on this connection): wait for what is left.
            self._header_timer = self.loop.call_later(left, self._header_timeout)
            return
        self._forget()
        self.transport.close()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self._phase is not _BODY or self.transport.is_closing():
            return
        message = f"request body not received within {self.limits.body_timeout_s:g} s"
        self._refuse(408, "request_timeout", message)


def protocol_with(limits: EdgeLimits, *, body_setting: str) -> type[EdgeHttpProtocol]:
    """The protocol class to give uvicorn (`http=`): every connection serves with `limits`, and
    a 413 names `body_setting`."""

    class BoundedHttpProtocol(EdgeHttpProtocol):
        LIMITS = limits
        BODY_LIMIT_SETTING = body_setting

    return BoundedHttpProtocol


_REASONS = {
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
}


def _error_response(status: int, code: str, message: str) -> bytes:
    """The API's error envelope, written straight to the socket: no app is involved yet."""
    body = b'{"error": {"code": "%s", "message": "%s"}}' % (code.encode(), message.encode())
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )
