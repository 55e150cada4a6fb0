"""Event loops whose TLS servers bound the handshake by the edge's header deadline.

The HTTP edge (`common/edge/protocol.py`) sees a TLS connection only once its handshake is
done: until then the loop's SSL protocol holds it, and uvicorn passes no
`ssl_handshake_timeout` to `create_server`, so asyncio's default (60 s) applies. A client
opening TCP connections and sending no ClientHello, or half of one, would hold each for a
minute, outside every deadline of the edge. These loops give each TLS server they create a
handshake deadline (the edge's header deadline), after which the connection is closed.

Connections in handshake are not counted against the edge's caps (the edge's protocol meets
them only after the handshake): each costs one descriptor for at most the handshake deadline,
as an idle connection before its first byte costs one for at most the header deadline.

Only `create_server`'s public `ssl_handshake_timeout` argument is used; the loop is made by
the caller (`SupervisorServer.run`), uvloop where it is installed (what uvicorn's `auto` loop
picks), else asyncio's selector loop (its default on POSIX).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

try:
    import uvloop
except ImportError:  # pragma: no cover - uvicorn[standard] installs it beside uvicorn
    uvloop = None  # type: ignore[assignment]


class _HandshakeDeadline:
    """Mixin: `create_server` with `ssl` defaults `ssl_handshake_timeout` to the deadline."""

    handshake_timeout_s: float

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", self.handshake_timeout_s)
        return await super().create_server(*args, **kwargs)  # type: ignore[misc]


def _loop_class() -> type[asyncio.AbstractEventLoop]:
    base: type[asyncio.AbstractEventLoop] = (
        uvloop.Loop if uvloop is not None else asyncio.SelectorEventLoop
    )
    return type(f"HandshakeBounded{base.__name__}", (_HandshakeDeadline, base), {})


def handshake_bounded_loops(timeout_s: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory (for `asyncio.Runner`) whose TLS servers close a connection whose
    handshake has not finished `timeout_s` after it opened."""
    if timeout_s <= 0:
        raise ValueError(f"a handshake deadline is positive, not {timeout_s}")
    cls = _loop_class()

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = cls()
        loop.handshake_timeout_s = timeout_s  # type: ignore[attr-defined]
        return loop

    return new_loop
