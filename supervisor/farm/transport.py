"""The supervisor's calls to its own model servers, in process.

A supervisor reaches its model servers on 127.0.0.1 (`supervisor.engines.control.base_url`);
on a real host that is a loopback hop, and in the farm both ends live in one process, where
the hop would only double the farm's CPU per heartbeat. This transport (the host's injectable
HTTP client, `HostDeps.http_factory`) hands each such call to the engine's app directly, with
the listener's faults applied: a crashed engine refuses the connection, a partitioned one never
answers (the caller's read timeout ends the wait), a slow one answers late. The control plane
and the proxy still reach the same engines over real sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
from starlette.types import ASGIApp

from supervisor.farm.listeners import Listener


class LocalTransport(httpx.AsyncBaseTransport):
    """Route `http://127.0.0.1:<port>` to the in-process app listening on that port."""

    def __init__(self, routes: Mapping[int, tuple[Listener, ASGIApp]]) -> None:
        self._routes = {
            port: (listener, httpx.ASGITransport(app=app))
            for port, (listener, app) in routes.items()
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        route = self._routes.get(request.url.port or 0)
        if request.url.host != "127.0.0.1" or route is None:
            raise httpx.ConnectError(
                f"nothing of the farm listens at {request.url}", request=request
            )
        listener, transport = route
        if not listener.listening:
            raise httpx.ConnectError("connection refused (crashed)", request=request)
        timeout = _read_timeout(request)
        try:
            async with asyncio.timeout(timeout):
                await listener.delay()
                return await transport.handle_async_request(request)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer within {timeout} s", request=request) from exc


def _read_timeout(request: httpx.Request) -> float | None:
    timeouts = request.extensions.get("timeout") or {}
    read = timeouts.get("read")
    return float(read) if read is not None else None
