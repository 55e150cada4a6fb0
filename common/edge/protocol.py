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
- a size limit on the request body (a route of BODY_ROUTES, for a client bearing TOKEN, has its
  own limit and body deadline: the supervisor's adapter chunk upload): a declared
  Content-Length over it is answered 413 as soon as the headers end, before any of the body
  is read (the app never runs); a chunked body is counted as it is parsed and cut at the
  first read that passes the limit (413, or a close if the app already answered; the app sees
  a disconnect). An app's own, finer body limit (the chat proxy's, the supervisor API's
  64 KiB) stays below this one;
- the keep-alive idle limit (uvicorn's, set from the limits, on one lazy timer per connection);
- trailer fields after a chunked body, counted with the headers against the same size and
  count limits (431): the raw bytes after the last chunk as they arrive, the fields once parsed;
- blank lines (CRLF, which the parser skips) between requests: the idle limit runs until a
  request's first byte, so they neither reset it nor start a header deadline;
- upgrade requests: one with a body (declared or chunked) is refused 400 at once (the parser
  stops at an upgrade's headers, and uvicorn's WebSocket protocol would wait for ever on the
  unparsed body), and a WebSocket is accepted only under WEBSOCKET_PATHS (every other upgrade is
  refused 400); an accepted one must finish its handshake within the header deadline;
- authentication before the body: a request whose body did not come with its headers may wait
  for it only if `_body_allowed` says so (a subclass's cheap credential check; the supervisor's
  bearer token, `TOKEN`), else 401 at once, body unread, connection closed; until its first
  body byte such a connection can be closed to make room, like an idle one;
- a cap on connections per process. A new connection past the cap closes the connection that
  has waited longest for a request (idle: no request being read or answered). Idle connections
  cost the attacker nothing, so refusing newcomers instead would let a flood of them lock out
  `/healthz` and every real client for a whole header deadline; closing an idle connection
  costs its owner one reconnect. Only when every connection is busy is the newcomer refused;
- a cap on connections per client address, so one address cannot hold every slot with busy
  connections: a newcomer past it is closed at once. The trusted proxy's addresses (uvicorn's
  `forwarded_allow_ips`, default loopback) are exempt: behind it every client shares them.

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
import ipaddress
import re
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from common.bearer import bearer_matches
from common.edge.limits import EdgeLimits
from common.private_apis import HttpToolsProtocol, websocket_handshake_done

__all__ = ["BodyRoute", "EdgeHttpProtocol", "protocol_with"]


class BodyRoute(NamedTuple):
    """A route whose body has a cap and deadline of its own, beyond the edge's: bulk uploads
    on an API whose every other body is small. Matched on the method and the raw request
    target (path and query) as they arrive; granted only to a request that may send a body at
    all (`_body_allowed`: it bears the token), so an anonymous one keeps the edge's cap."""

    method: bytes
    target: re.Pattern[bytes]
    max_body_bytes: int
    body_timeout_s: float
    setting: str  # what a 413 names


class _Trusted:
    """The addresses exempt from the per-address cap: uvicorn's `forwarded_allow_ips` (the
    proxy in front, whose address every client behind it shares)."""

    def __init__(self, allowed: str | Iterable[str]) -> None:
        entries = allowed.split(",") if isinstance(allowed, str) else list(allowed)
        self.everyone = False
        exact: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in (e.strip() for e in entries):
            if entry == "*":
                self.everyone = True
            elif "/" in entry:
                try:
                    self.networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    continue  # a unix socket path or a typo: no address of a TCP client
            elif entry:
                exact.add(entry)
        self.exact = frozenset(exact)

    def __contains__(self, address: str) -> bool:
        if self.everyone or address in self.exact:
            return True
        if not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.networks)


class _Books:
    """One server's connections as the caps see them: those waiting for a request (or for a
    body's first byte), oldest first, and the connections per client address."""

    def __init__(self, config: Config) -> None:
        # A dict keeps insertion order: the first key has waited longest.
        self.waiting: dict[EdgeHttpProtocol, None] = {}
        self.per_address: dict[str, int] = {}
        self.trusted = _Trusted(config.forwarded_allow_ips)

    def oldest(self, other_than: EdgeHttpProtocol) -> EdgeHttpProtocol | None:
        """The connection to close for `other_than`: the longest-waiting one from its own
        address among the SAME_ADDRESS_SCAN longest-waiting, else the longest-waiting one. A
        flood from one address that opens connections fast keeps every waiting connection
        young; taking its own first keeps a normal client's new connection, waiting for its
        first byte, from being the oldest one closed."""
        address = other_than._address
        first = None
        for scanned, protocol in enumerate(self.waiting):
            if protocol is other_than:
                continue
            if address is None or protocol._address == address:
                # From a trusted address (not counted), simply the longest-waiting one.
                return protocol
            if first is None:
                first = protocol
            if scanned >= SAME_ADDRESS_SCAN:
                break
        return first


# How many of the longest-waiting connections are looked through for one of the newcomer's own
# address: bounded, so making room costs the same under a flood from many addresses.
SAME_ADDRESS_SCAN = 64

_BOOKS: weakref.WeakKeyDictionary[ServerState, _Books] = weakref.WeakKeyDictionary()


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
    # The bearer token a request must carry to wait for its body (None: no check), and the
    # path prefixes where a WebSocket upgrade is accepted (none: every upgrade is refused).
    TOKEN: ClassVar[bytes | None] = None
    WEBSOCKET_PATHS: ClassVar[tuple[bytes, ...]] = ()
    BODY_ROUTES: ClassVar[tuple[BodyRoute, ...]] = ()

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
        books = _BOOKS.get(server_state)
        if books is None:
            books = _BOOKS[server_state] = _Books(config)
        self._books = books
        self._address: str | None = None  # counted against the per-address cap
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
        # The current request's body deadline and the setting its 413 names (BODY_ROUTES).
        self._body_timeout_s = self.limits.body_timeout_s
        self._body_setting = self.BODY_LIMIT_SETTING
        self._chunk = 0  # length of the read being parsed
        self._refusal: tuple[int, str, str] | None = None
        # Waiting for the first byte of a body that did not come with its headers (evictable).
        self._body_waiting = False
        # A chunked body: the body count at the last chunk header (-1: none yet), and the raw
        # bytes since it that carried no body (the trailer section, after the last chunk).
        self._chunk_mark = -1
        self._trailer_bytes = 0
        self._trailer_budget = 0
        self._n_headers = 0  # header fields at the end of the headers (trailers come after)

    @classmethod
    def edge_limits(cls) -> EdgeLimits:
        """The limits a new connection serves with (read once per connection)."""
        if cls.LIMITS is None:
            raise RuntimeError(f"{cls.__name__} has no limits: build it with protocol_with()")
        return cls.LIMITS

    # Connection life.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._count_address():
            transport.abort()
            return
        self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        self._header_timer = self.loop.call_at(self._header_deadline, self._header_timeout)
        self._books.waiting[self] = None
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        victim = self._books.oldest(other_than=self)
        if victim is None:
            # Every other connection is serving a request: this one is the one too many.
            self._forget()
            self.transport.abort()
            return
        victim._forget()
        victim.transport.close()

    def _count_address(self) -> bool:
        """Count this connection against its address's cap; False: over it, refuse."""
        client = self.client
        if client is None or client[0] in self._books.trusted:
            return True
        address = client[0]
        counts = self._books.per_address
        count = counts.get(address, 0)
        if count >= self.limits.max_connections_per_address:
            return False
        counts[address] = count + 1
        self._address = address
        return True

    def _release_address(self) -> None:
        address, self._address = self._address, None
        if address is None:
            return
        counts = self._books.per_address
        left = counts.get(address, 1) - 1
        if left > 0:
            counts[address] = left
        else:
            counts.pop(address, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        self._release_address()
        super().connection_lost(exc)

    def _forget(self) -> None:
        self._books.waiting.pop(self, None)
        self._idle_deadline = None
        for timer in (self._header_timer, self._body_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._keepalive_timer = None

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport over (and this connection's place in
        # `connections`): after its handshake its own ping deadlines bound it, and until then
        # the header deadline does, so a handshake that never completes cannot hold a slot.
        self._forget()
        self._release_address()
        super().handle_websocket_upgrade()
        transport = self.transport
        self.loop.call_later(
            self.limits.header_timeout_s, _handshake_due, transport.get_protocol(), transport
        )

    # Reading.

    def data_received(self, data: bytes) -> None:
        # Not uvicorn's _unset_keepalive_if_required() here: a request's first byte ends the
        # idle time (on_message_begin), blank lines between requests do not.
        self._chunk = len(data)
        phase = self._phase
        if phase is _HEADERS:
            self._header_bytes += self._chunk
        elif self._body_waiting:
            # The body's first bytes: the connection is busy, no longer evictable.
            self._body_waiting = False
            self._books.waiting.pop(self, None)
        body_before = self._body_bytes
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
        elif self._phase is _BODY and not self.transport.is_closing():
            if self._body_timer is None:
                # Only a body that did not come with its headers is waited for.
                self._await_body()
            elif self._chunk_mark == self._body_bytes == body_before:
                # A read past a chunk header that carried no body: trailer fields.
                self._count_trailers()

    def _await_body(self) -> None:
        """The headers ended and the body is still to come: wait for it only for a client
        that may send one, on the body deadline, evictable until the body's first byte."""
        if not self._body_allowed():
            self._refuse(401, "unauthorized", _UNAUTHORIZED)
            return
        self._body_timer = self.loop.call_later(self._body_timeout_s, self._body_timeout)
        if self._body_bytes == 0:
            self._body_waiting = True
            self._books.waiting[self] = None

    def _body_allowed(self) -> bool:
        """Whether this request may wait for its body: it carries TOKEN (any request, when
        TOKEN is None). Called only for a body that did not come with its headers."""
        token = self.TOKEN
        return token is None or bearer_matches(self.headers, token)

    def _count_trailers(self) -> None:
        if self._trailer_bytes == 0:
            # The first read of a trailer section: what the headers left of the size limit.
            self._trailer_budget = self.limits.max_header_bytes - _size(self.url, self.headers)
        self._trailer_bytes += self._chunk
        if self._trailer_bytes > self._trailer_budget:
            self._refuse(431, "headers_too_large", self._too_large_message(" with trailers"))

    def on_chunk_header(self) -> None:
        # Called by the parser for chunked bodies only: nothing for a declared length.
        self._chunk_mark = self._body_bytes
        self._trailer_bytes = 0

    def on_chunk_complete(self) -> None:
        self._chunk_mark = -1

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is not _HEADERS:
            # A request on a kept-alive connection (or pipelined): a fresh header deadline,
            # and a raw count that starts with the whole read it began in (over-counting a
            # pipelined predecessor's tail errs on the safe side).
            self._phase = _HEADERS
            self._idle_deadline = None  # a request began: the connection is no longer idle
            self._header_bytes = self._chunk
            self._header_deadline = self.loop.time() + self.limits.header_timeout_s
            if self._header_timer is None:
                self._header_timer = self.loop.call_at(self._header_deadline, self._header_timeout)

    def on_headers_complete(self) -> None:
        self._books.waiting.pop(self, None)
        # Checked once the headers are parsed, and only when the raw count says they might be
        # too long: the raw check in data_received already bounds what can be buffered.
        count = self._n_headers = len(self.headers)
        if count > self.limits.max_headers:
            self._stop(431, "too_many_headers", f"more than {self.limits.max_headers} headers")
        if (
            self._header_bytes > self.limits.max_header_bytes
            and _size(self.url, self.headers) > self.limits.max_header_bytes
        ):
            self._stop(431, "headers_too_large", self._too_large_message())
        if self.parser.should_upgrade():
            self._check_upgrade()
        self._body_bytes = 0
        self._chunk_mark = -1
        if self.BODY_ROUTES:
            self._route_body_limits()
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

    def _route_body_limits(self) -> None:
        """This request's body cap and deadline: its BODY_ROUTES entry's for a client that may
        send a body, else the edge's."""
        limits = self.limits
        cap, deadline, setting = (
            limits.max_body_bytes,
            limits.body_timeout_s,
            self.BODY_LIMIT_SETTING,
        )
        method = self.parser.get_method()
        for route in self.BODY_ROUTES:
            if route.method == method and route.target.match(self.url) and self._body_allowed():
                cap, deadline, setting = route.max_body_bytes, route.body_timeout_s, route.setting
                break
        self._max_body_bytes, self._body_timeout_s, self._body_setting = cap, deadline, setting

    def _check_upgrade(self) -> None:
        """Refuse (400) an upgrade with a body, and any upgrade but a WebSocket on its paths:
        the parser stops at an upgrade's headers, so its body would be read by nobody."""
        for name, value in self.headers:
            if name == b"transfer-encoding" or (name == b"content-length" and int(value) > 0):
                self._stop(400, "upgrade_with_body", "an upgrade request must not carry a body")
        if not (
            self.WEBSOCKET_PATHS
            and self.url.startswith(self.WEBSOCKET_PATHS)
            and self._should_upgrade()
        ):
            self._stop(400, "upgrade_refused", "no protocol upgrade is served on this path")

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
        if len(self.headers) != self._n_headers and self._phase is _BODY:
            # Trailer fields (uvicorn adds them to the headers): the headers' limits hold.
            if len(self.headers) > self.limits.max_headers:
                self._stop(431, "too_many_headers", f"more than {self.limits.max_headers} headers")
            if _size(self.url, self.headers) > self.limits.max_header_bytes:
                self._stop(431, "headers_too_large", self._too_large_message(" with trailers"))
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
        self._books.waiting[self] = None

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when bytes arrive (not here: data_received is the edge's) and when
        # the connection is lost (_forget has ended the idle time): nothing to do.
        pass

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

    def _too_large_message(self, what: str = "") -> str:
        return f"request line and headers{what} exceed {self.limits.max_header_bytes} bytes"

    def _body_too_large_message(self) -> str:
        return f"request body exceeds {self._body_setting} ({self._max_body_bytes} bytes)"

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
        message = f"request body not received within {self._body_timeout_s:g} s"
        self._refuse(408, "request_timeout", message)


def _size(url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
    """The request line and header fields as the size limit counts them."""
    return len(url) + sum(len(n) + len(v) + 4 for n, v in headers)


def _handshake_due(protocol: asyncio.BaseProtocol, transport: asyncio.Transport) -> None:
    """An upgraded connection's header deadline: closed if its handshake is not done."""
    if not transport.is_closing() and not websocket_handshake_done(protocol):
        transport.abort()


def protocol_with(
    limits: EdgeLimits,
    *,
    body_setting: str,
    token: str | None = None,
    body_routes: tuple[BodyRoute, ...] = (),
) -> type[EdgeHttpProtocol]:
    """The protocol class to give uvicorn (`http=`): every connection serves with `limits`, a
    413 names `body_setting`, a body is waited for only from a client bearing `token` (when
    set), and `body_routes` have body limits of their own."""

    class BoundedHttpProtocol(EdgeHttpProtocol):
        LIMITS = limits
        BODY_LIMIT_SETTING = body_setting
        TOKEN = token.encode() if token else None
        BODY_ROUTES = body_routes

    return BoundedHttpProtocol


_UNAUTHORIZED = "a valid bearer token is required before the request body (Authorization: Bearer)"

_REASONS = {
    400: b"Bad Request",
    401: b"Unauthorized",
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
            b'www-authenticate: Bearer realm="haru"\r\n' if status == 401 else b"",
            b"connection: close\r\n\r\n",
            body,
        ]
    )
