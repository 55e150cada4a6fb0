"""One loopback listener per app of the farm, with the faults a host or its network shows.

Each listener serves one ASGI app on its own port (of the farm's loopback address) through
uvicorn's HTTP protocol (the supervisor's through its HTTP edge, `common.edge`), with no
`uvicorn.Server` around it: a server per port would cost a main loop and a signal handler
each, and the farm holds thousands.

Faults, per listener:
- `crash`: stop listening and drop every open connection; a new connection is refused.
- `slow`: answer every request `slow_s` late.
- `partition`: accept and never answer: a request waits, unanswered, until the fault is
  cleared (then it is answered, as a healed network delivers what it held), its client having
  long given up.
"""

from __future__ import annotations

import asyncio
import copy
import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

FAULTS = ("none", "crash", "slow", "partition")
# A slow answer is at most this late: a fault must never hold a request for ever.
MAX_SLOW_S = 600.0


def base_config() -> uvicorn.Config:
    """The uvicorn settings every listener copies: httptools, no lifespan, no access log."""
    config = uvicorn.Config(
        _no_app,
        http="httptools",
        lifespan="off",
        access_log=False,
        proxy_headers=False,
        log_config=None,
        ws="none",
    )
    config.load()
    return config


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("a farm listener serves its own app")


class Listener:
    """Serve `app` on `address`:`port` (loopback); crash, slow down or partition on request."""

    def __init__(
        self,
        app: ASGIApp,
        port: int,
        *,
        base: uvicorn.Config,
        protocol: type[asyncio.Protocol] | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.address = address
        self.port = port
        self.fault = "none"
        self.slow_s = 0.0
        self._healed = asyncio.Event()
        self._healed.set()
        # A shallow copy: what differs per listener is the app and (for a supervisor, whose
        # edge checks its own token) the protocol class.
        self.config = copy.copy(base)
        self.config.loaded_app = self._gate(app)
        if protocol is not None:
            self.config.http_protocol_class = protocol
        self.state = ServerState()
        self._server: asyncio.Server | None = None

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        """Listen (again, after a crash); raise OSError when the port is taken."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.address, self.port))
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(False)
        config, state = self.config, self.state

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state={}, _loop=loop
            )

        self._server = await loop.create_server(protocol, sock=sock, backlog=256)

    def stop(self) -> None:
        """Stop listening and drop every open connection, as a host that died would."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self.state.connections):
            transport: Any = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()

    async def set_fault(self, fault: str, slow_s: float = 0.0) -> None:
        """Set this listener's fault (`none` clears it); raise ValueError for a bad one."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
        if not 0 <= slow_s <= MAX_SLOW_S:
            raise ValueError(f"slow must be 0 to {MAX_SLOW_S:g} s")
        self.fault, self.slow_s = fault, slow_s
        if fault == "partition":
            self._healed.clear()
        else:
            self._healed.set()
        if fault == "crash":
            self.stop()
        else:
            await self.start()

    def _gate(self, app: ASGIApp) -> ASGIApp:
        async def gated(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                await self.delay()
            await app(scope, receive, send)

        return gated

    async def delay(self) -> None:
        """Hold a request as the fault says: `slow_s` when slow, until healed when
        partitioned."""
        if self.fault == "slow" and self.slow_s > 0:
            await asyncio.sleep(self.slow_s)
        elif not self._healed.is_set():
            await self._healed.wait()
