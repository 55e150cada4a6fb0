"""An overall deadline on every socket operation of a supervisor call.

httpx's timeouts are per operation: a server that sends one byte every 0.5 s resets the read
timeout forever, in the header phase as much as in the body. This network backend (httpcore's
extension point) bounds each connect, read and write by what is left of the call's deadline, set
by `deadline()` around the whole exchange, so a trickling supervisor is cut when the deadline
passes, whatever phase it trickles in.

The same backend checks a pinned supervisor's certificate (fleets/core/supervisor_tls.py): right
after each TLS handshake, the SHA-256 of the certificate the peer presented must be the domain's
pin, or the connection is closed before the request is written (`PinMismatch`). httpx 0.28 has
no hook of its own for that (its `verify` takes a CA or a context, and an SSLContext cannot
check a digest), and the backend is where httpcore hands over the TLS stream.
"""

from __future__ import annotations

import ssl
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore
import httpx

from common.private_apis import set_transport_pool
from common.tls_pin import peer_fingerprint

_deadline: ContextVar[float | None] = ContextVar("haru_supervisor_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Bound every socket operation in this block (this thread) to `seconds` from now."""
    at = time.monotonic() + seconds
    token = _deadline.set(at)
    try:
        yield at
    finally:
        _deadline.reset(token)


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    at = _deadline.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the call's overall deadline passed")
    return left if timeout is None else min(timeout, left)


class PinMismatch(httpcore.ConnectError):
    """The supervisor's certificate is not the one pinned for it: refused after the handshake,
    before a byte of the request (and so the token) is written."""

    def __init__(self, presented: str | None, pinned: str) -> None:
        super().__init__(f"certificate {presented or '(none)'} is not the pinned {pinned}")
        self.presented = presented
        self.pinned = pinned


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, pin: str | None = None) -> None:
        self._inner = inner
        self._pin = pin

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        tls = self._inner.start_tls(ssl_context, server_hostname, bounded)
        if self._pin is not None:
            ssl_object = tls.get_extra_info("ssl_object")
            presented = peer_fingerprint(ssl_object) if ssl_object is not None else None
            if presented != self._pin:
                tls.close()
                raise PinMismatch(presented, self._pin)
        return _Stream(tls)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """The sync backend, each operation bounded by the deadline; with a `pin`, every TLS
    handshake must present exactly that certificate."""

    def __init__(self, pin: str | None = None) -> None:
        self._inner = httpcore.SyncBackend()
        self._pin = pin

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, bounded, local_address, socket_options)
        return _Stream(stream, self._pin)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, bounded, socket_options), self._pin)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def supervisor_ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """TLS for supervisors: verified against `ca_bundle` alone when given (supervisors across
    clouds often carry certificates from the operator's own CA), else the system's store."""
    if ca_bundle is None:
        return httpx.create_ssl_context()
    # cafile only: the bundle replaces the system store, so a certificate from a public CA
    # cannot impersonate a supervisor. Still verified: hostname checks and CERT_REQUIRED.
    return ssl.create_default_context(cafile=ca_bundle)


def pinned_ssl_context() -> ssl.SSLContext:
    """TLS for a supervisor whose certificate is pinned: no CA or name check, because the pin
    (checked on every handshake by the backend) is stricter than both; TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# httpcore's pool keeps its connections in one list, and every request walks it, polls each
# idle socket for an early close and, per connection, counts the idle ones again: quadratic in
# the connections kept. One control plane heartbeats every supervisor of every fleet (2,000 at
# 1,000 fleets), so one pool keeping them all would cost more per call than a new connection,
# and httpx's default of 20 kept makes every call at that size a new connection. A pool per
# shard of origins keeps each walk to a few dozen, and every supervisor's connection alive from
# one heartbeat to the next.
POOL_SHARDS = 128
KEEPALIVE_PER_SHARD = 32
# Shorter than the supervisor's own keep-alive (HARU_SUPERVISOR_HTTP_KEEPALIVE_TIMEOUT_MS, 5 s
# by default), with a margin: a connection the supervisor is closing at the moment it is reused
# loses the request sent on it (nothing retries it), and that heartbeat with it. At the default
# 5 s interval each heartbeat therefore opens a connection, as before; at the example's 2 s, one
# connection per supervisor carries them all.
KEEPALIVE_EXPIRY_S = 4.0


class ShardedPool:
    """httpcore connection pools, one per shard of origins (host and port)."""

    def __init__(self, context: ssl.SSLContext, backend: httpcore.NetworkBackend, shards: int):
        self._shards = [
            httpcore.ConnectionPool(
                ssl_context=context,
                max_connections=100,
                max_keepalive_connections=KEEPALIVE_PER_SHARD,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
                network_backend=backend,
            )
            for _ in range(max(1, shards))
        ]

    def shard_of(self, request: httpcore.Request) -> httpcore.ConnectionPool:
        url = request.url
        return self._shards[hash((url.host, url.port)) % len(self._shards)]

    def handle_request(self, request: httpcore.Request) -> httpcore.Response:
        return self.shard_of(request).handle_request(request)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()

    def __enter__(self) -> ShardedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport, its connection pool built on the deadline-bounded backend; with a
    `pin`, a pool of its own whose every connection presented that certificate."""

    def __init__(
        self, *, ca_bundle: str | None = None, pin: str | None = None, shards: int = POOL_SHARDS
    ) -> None:
        super().__init__()
        # httpx's pool (TLS verified, keep-alive) on our backend, sharded by origin.
        context = pinned_ssl_context() if pin else supervisor_ssl_context(ca_bundle)
        set_transport_pool(self, ShardedPool(context, _Backend(pin or None), shards))
