"""The pooled HTTP/1.1 client to model servers: asyncio transports plus the httptools parser.

Re-measure the choice with `bench/proxy.py --client httpx` and `--client aiohttp` (the library
stand-ins live in bench/upstream_clients.py). Why not httpx (measured on the 2-core CI machine): an
httpx.AsyncClient costs about 0.45 ms of CPU per request and its pool's request assignment
degrades with many connections (about 800 requests/s at 32 concurrent), which alone exceeds the
proxy's budget (< 1 ms added at the median, half the direct throughput). This client costs a
few tens of microseconds: the same C parser (llhttp via httptools) that uvicorn uses for the
server side, one keep-alive connection stack per origin, and nothing else (no cookies, no
redirects, no proxies from the environment: none of them belong on this path).

Scope, deliberately narrow: one POST with a fully buffered body to an http(s) origin; response
streamed back with flow control. One pool per process and event loop (`pool()`).

Why not aiohttp either (the house rule prefers a well-kept library, so it was tried: aiohttp
3.14.5, one ClientSession per loop, TCPConnector(limit=0, keepalive_timeout=4),
auto_decompress=False, DummyCookieJar, skip_auto_headers, ClientTimeout(total=None,
sock_read=None) inside asyncio.timeout; the same tests passed). bench/proxy.py as shipped, six
runs of each client alternating on the 2 shared cores, medians:

    added p50 at c=1 (ms)           hand-written   aiohttp
      raw upstream, non-streaming       0.29         0.39
      raw upstream, streaming           0.34         0.42
      sim engine,   non-streaming       0.34         0.45
      sim engine,   streaming           0.40         0.49
    requests/s through Haru at c=32 (aiohttp as a share of hand-written)
      raw upstream, non-streaming       8297         4532  (55%)
      raw upstream, streaming           5220         4143  (79%)
      sim engine,   non-streaming       6934         4329  (62%)
      sim engine,   streaming           3777         3145  (83%)
    p99 at c=32                      7-18 ms      47-51 ms

The client alone (uvloop, same raw upstream, one process): about 40 vs 110 us of CPU per
request at c=1 and 17 vs 61 us at c=32. aiohttp allocates several times more objects per request
(3x the gen-0 collections while serving half the requests), and the full collections this
triggers in a Django process are what its p99 is made of; gc.freeze() after start-up cut its p99
to 10-16 ms but not the throughput gap (c=32 non-streaming still about half). Both under the
1 ms budget at c=1; aiohttp fails "within 25% of the hand-written client at c=32" for
non-streaming, so this module stays, its behaviour (https included) pinned by
tests/proxy/test_proxy_upstream.py.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import select
import ssl
import time
from dataclasses import dataclass
from functools import cached_property

import httptools

from fleets.proxy import errors

# Model servers on uvicorn (vLLM, SGLang) drop idle keep-alive connections after 5 s; reusing
# one at that moment loses the request, so idle connections are retired a second earlier.
IDLE_EXPIRY_S = 4.0
MAX_IDLE_PER_ORIGIN = 256
# Flow control: stop reading from the model server while this much is buffered unsent.
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024

# Request headers passed to the model server. Everything else stays here: above all the
# client's Authorization (Haru's token), cookies and forwarding headers.
# A tuple: sent in this order, the same in every process.
FORWARD_REQUEST_HEADERS = (
    b"content-type",
    b"accept",
    b"accept-encoding",
    b"accept-language",
    b"x-request-id",
)
# Response headers passed back. Hop-by-hop headers (connection, keep-alive, transfer-encoding,
# ...) never are, and neither are the model server's own server/date/cookies.
FORWARD_RESPONSE_HEADERS = frozenset(
    {b"content-type", b"content-encoding", b"content-length", b"cache-control", b"x-request-id"}
)


class UpstreamClosed(Exception):
    """The model server closed the connection or sent a malformed response."""


_DOWN_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})


class NotStarted(Exception):
    """The model server provably never received the request: sending it elsewhere is safe.

    Only a connection that could not be opened (refused, reset or unreachable while
    connecting) proves it: no byte of the request left this process.
    """


@dataclass(frozen=True)
class Target:
    """One upstream endpoint, parsed once when the routing snapshot is built."""

    scheme: str
    host: str
    port: int
    host_header: bytes
    path: bytes

    # Both read per request, built on the first (a target lives as long as its snapshot).
    @cached_property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)

    @cached_property
    def head_start(self) -> bytes:
        """The request line and the header lines that are the same for every request."""
        return b"POST %b HTTP/1.1\r\nhost: %b\r\nuser-agent: haru-proxy\r\n" % (
            self.path,
            self.host_header,
        )


class Response:
    """A model server's response: status and headers now, the body as it arrives."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done: asyncio.Future = conn.loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self.complete = False
        self.error: Exception | None = None
        self._length_known = False

    # Called by the connection (from the parser or the transport).
    def _body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER:
            self._conn.live_transport.pause_reading()
        self._wake()

    def _finish(self, error: Exception | None = None) -> None:
        if self.complete or self.error is not None:
            return
        if error is None:
            self.complete = True
        else:
            self.error = error
            if not self.headers_done.done():
                self.headers_done.set_exception(error)
                self.headers_done.exception()  # retrieved: a cancelled caller may never read it
        self._wake()

    def fail(self, why: str) -> None:
        """End the body as broken (a stream gone silent past its bound): the reader gets
        UpstreamClosed, and closing the connection tells the model server to stop."""
        self._finish(UpstreamClosed(why))
        self._conn.live_transport.abort()

    def _lost(self, exc: Exception | None) -> None:
        # A body without Content-Length or chunked encoding ends when the connection does.
        if self.headers_done.done() and not self._length_known and exc is None:
            self._finish()
        else:
            self._finish(UpstreamClosed("connection closed before the response ended"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def buffered(self) -> bytes:
        """Take every body byte that has arrived so far (chunked framing removed)."""
        if not self._chunks:
            return b""
        data = b"".join(self._chunks)
        self._chunks.clear()
        if self._buffered > _LOW_WATER:
            self._conn.live_transport.resume_reading()
        self._buffered = 0
        return data

    def peek(self) -> bytes:
        """Every body byte that has arrived so far, left in place."""
        return b"".join(self._chunks)

    async def aiter_raw(self):
        """Yield body bytes as the model server sends them (chunked framing removed)."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered <= _LOW_WATER:
                    self._conn.live_transport.resume_reading()
                yield chunk
                continue
            if self.error is not None:
                raise self.error
            if self.complete:
                return
            self._waiter = self._conn.loop.create_future()
            await self._waiter

    async def aclose(self) -> None:
        """Release the connection: back to the pool when the body was read, else closed."""
        self._conn.release(reuse=self.complete)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Pool, origin: tuple[str, str, int]) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.keep_alive = False
        self.idle_since = 0.0
        self.response_started = False  # a byte of the current response has arrived
        self._informational = False
        # Watches the plain TCP socket for `stale()` (None over TLS: not checked). poll, not
        # select: a busy server's descriptors pass select's limit of 1024.
        self._poll: select.poll | None = None

    @property
    def live_transport(self) -> asyncio.Transport:
        """The transport, which asyncio sets (connection_made) before create_connection returns,
        so every connection the pool hands out has one."""
        assert self.transport is not None
        return self.transport

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.origin[0] == "http":
            # Over TLS the socket can hold bytes that are not HTTP (session tickets): skipped.
            self._poll = select.poll()
            self._poll.register(transport.get_extra_info("socket").fileno(), select.POLLIN)

    def stale(self) -> bool:
        """Whether this idle connection has something to read: the server closed it (FIN or
        RST) or sent bytes nobody asked for, and the loop has not processed it yet.

        A model server that died a moment ago closed its connections; a request written to
        one of them fails after it left, and could not then be shown never to have started
        (so it would be answered 502, not held). One zero-timeout poll per reuse.
        """
        if self._poll is None:
            return False
        try:
            return bool(self._poll.poll(0))  # readable, hung up or in error: not reusable
        except OSError:
            return True

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.response.complete:
            self.close()  # bytes nobody asked for: the stream is out of step
            return
        self.response_started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response._finish(UpstreamClosed(f"malformed response: {exc}"))
            self.close()

    def eof_received(self):
        self.closed = True  # before connection_lost arrives: never hand this one out again
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.response is not None:
            self.response._lost(exc)

    # httptools callbacks (must not raise)
    # data_received feeds the parser only while a response is current; the `is None` checks
    # only narrow the type.
    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if not self._informational and response is not None:
            name = name.lower()
            if name in (b"content-length", b"transfer-encoding"):
                response._length_known = True
            response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        # 1xx (100 Continue, 103 Early Hints) precede the real response: skip them.
        self._informational = status < 200
        if self._informational or self.response is None:
            return
        self.response.status = status
        self.keep_alive = self.parser.should_keep_alive()
        if not self.response.headers_done.done():
            self.response.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._body(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        if self.response is not None:
            self.response._finish()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def release(self, *, reuse: bool) -> None:
        response, self.response = self.response, None
        if response is not None and not response.complete:
            # Unread body: closing is how the model server learns the client went away.
            self.live_transport.abort()
            self.closed = True
            return
        if reuse and self.keep_alive and not self.closed:
            self.live_transport.resume_reading()  # in case flow control paused it
            self.idle_since = time.monotonic()
            self.pool._idle_push(self)
        else:
            self.close()


class Pool:
    """Idle keep-alive connections, a LIFO stack per origin (the warmest one first)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None

    def _idle_push(self, conn: _Connection) -> None:
        stack = self._idle.setdefault(conn.origin, [])
        if len(stack) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
        else:
            stack.append(conn)

    def _idle_pop(self, origin) -> _Connection | None:
        stack = self._idle.get(origin)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            fresh = now - conn.idle_since < IDLE_EXPIRY_S
            live = fresh and not conn.closed and not conn.live_transport.is_closing()
            if live and not conn.stale():  # the syscall last, only for a live candidate
                return conn
            conn.close()
        return None

    async def _connect(self, target: Target) -> _Connection:
        loop = asyncio.get_running_loop()
        ssl_context = None
        if target.scheme == "https":
            if self._ssl is None:
                self._ssl = tls_context()
            ssl_context = self._ssl
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self, target.origin),
                target.host,
                target.port,
                ssl=ssl_context,
                server_hostname=target.host if ssl_context else None,
            )
        except (ConnectionError, OSError) as exc:
            # Refused, reset or unreachable while connecting: nothing was sent, and the server
            # (or its host) is down, so another domain may take it. A TLS or DNS failure is a
            # configuration fault: answered at once, never held.
            if isinstance(exc, ConnectionError) or exc.errno in _DOWN_ERRNOS:
                raise NotStarted(type(exc).__name__) from exc
            raise
        return conn

    async def send(self, target: Target, head: bytes, body: bytes) -> Response:
        """Send one request and return once the response headers are in."""
        conn = self._idle_pop(target.origin)
        fresh = conn is None
        if conn is None:
            conn = await self._connect(target)
        try:
            return await self._exchange(conn, head, body)
        except UpstreamClosed:
            if fresh or conn.response_started:
                raise
        # The reused connection died before any response byte: the server dropped it idle and
        # never saw the request, so one retry on a fresh connection is safe.
        try:
            fresh_conn = await self._connect(target)
        except NotStarted as exc:
            # The request did go out on the reused connection, to a server now gone: it may
            # have started it, so it must not be sent anywhere else.
            raise UpstreamClosed(f"connection closed, then {exc}") from exc
        return await self._exchange(fresh_conn, head, body)

    async def _exchange(self, conn: _Connection, head: bytes, body: bytes) -> Response:
        response = Response(conn)
        conn.response = response
        conn.response_started = False
        try:
            try:
                conn.live_transport.writelines((head, body))
            except RuntimeError as exc:  # uvloop refuses writes on a transport that just closed
                raise UpstreamClosed("connection closed before the request was sent") from exc
            await response.headers_done
        except BaseException:
            # Timed out, cancelled (the client left) or failed: never reuse a connection with
            # a request in flight; closing it also tells the model server to stop.
            conn.response = None
            conn.live_transport.abort()
            conn.closed = True
            raise
        return response

    async def aclose(self) -> None:
        for stack in self._idle.values():
            for conn in stack:
                conn.close()
        self._idle.clear()


def tls_context() -> ssl.SSLContext:
    """TLS for https model servers: the system's trust store, certificate and host verified."""
    return ssl.create_default_context()


class _LoopPool:
    """This process's pool and the event loop its connections belong to."""

    __slots__ = ("loop", "pool")

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self.loop: asyncio.AbstractEventLoop | None = None


_current = _LoopPool()


def pool(loop: asyncio.AbstractEventLoop | None = None) -> Pool:
    """Return this process's pool for the running loop (`loop`, if the caller has it),
    creating it on first use."""
    if loop is None:
        loop = asyncio.get_running_loop()
    current = _current
    if current.pool is None or current.loop is not loop:
        current.pool, current.loop = Pool(), loop
    return current.pool


async def pool_close() -> None:
    """Close this loop's idle connections (tests, shutdown)."""
    current = _current
    if current.pool is not None and current.loop is asyncio.get_running_loop():
        await current.pool.aclose()
    current.pool, current.loop = None, None


def request_head(target: Target, headers: dict[bytes, bytes], body_length: int) -> bytes:
    """Build the request line and headers: the path comes only from the routing snapshot."""
    lines = [target.head_start + b"content-length: %d" % body_length]
    for name in FORWARD_REQUEST_HEADERS:
        value = headers.get(name)
        if value is not None and b"\r" not in value and b"\n" not in value:
            lines.append(name + b": " + value)
    if b"content-type" not in headers:
        lines.append(b"content-type: application/json")
    if b"accept-encoding" not in headers:
        # Bytes pass through undecoded, so ask for what any client can read.
        lines.append(b"accept-encoding: identity")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def response_headers(response: Response) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in response.headers if n in FORWARD_RESPONSE_HEADERS]


async def open_stream(
    target: Target,
    head: bytes,
    body: bytes,
    *,
    timeout_ms: int,
    model: str,
    task: asyncio.Task | None = None,
) -> Response:
    """Send the request; return the response once its headers arrived (body unread).

    HARU_CHAT_HEADER_TIMEOUT_MS bounds connect + send + time to headers as one budget; nothing
    bounds the body, so a stream that goes quiet mid-generation is never cut. `task` is the
    current task, if the caller has it (each lookup is a getpid() system call on Python 3.11).
    """
    # asyncio.timeout's own bookkeeping, by hand: one timer that cancels this task, told apart
    # from any other cancel (the client leaving) as asyncio.timeout does, by the task's cancel
    # count. It costs a few percent of the proxy's CPU less per request (bench/proxy.py).
    if task is None:
        task = asyncio.current_task()
        assert task is not None
    loop = task.get_loop()
    cancels = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = loop.call_later(timeout_ms / 1000, expire)
    try:
        return await pool(loop).send(target, head, body)
    except asyncio.CancelledError:
        if expired and task.uncancel() <= cancels:
            raise errors.upstream_timeout(
                f"model server for {model!r} sent no response headers within {timeout_ms} ms"
            ) from None
        raise
    except NotStarted:
        raise  # the caller may hold it and send it elsewhere
    except (OSError, UpstreamClosed) as exc:
        err = errors.upstream_unreachable(
            f"model server for {model!r} is unreachable ({type(exc).__name__})"
        )
        err.lost = isinstance(exc, UpstreamClosed)
        raise err from None
    finally:
        timer.cancel()
