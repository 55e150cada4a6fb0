"""The farm itself: every host built and listening, and its own loopback control API.

    GET  /farm/hosts                     every host: URLs, faults, model states (no tokens)
    POST /farm/hosts/<name>/fault        {"fault": "crash"|"slow"|"partition"|"none",
                                          "target": "all"|"supervisor"|"models", "slowMs": N}
    GET  /farm/stats                     hosts, listeners, resident memory and CPU seconds
    GET  /farm/heartbeats                every host's `GET /v1/status` arrivals (monotonic s)

The control API listens on loopback only and takes no token, as the simulator's `/_sim/`
controls do: it is a test and benchmark tool.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from common.farm_manifest import HostPlan
from supervisor.farm.hosts import FarmHost
from supervisor.farm.listeners import MAX_SLOW_S, Listener, base_config
from supervisor.farm.transport import LocalTransport
from supervisor.settings import edge_limits_from_env

# A control request is a few fields.
MAX_CONTROL_BODY = 4096


def rss_mib() -> float:
    """This process's resident memory now (Linux), in MiB; 0 where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_descriptor_limit(needed: int) -> None:
    """Every listener and connection is a descriptor: lift the soft limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Farm:
    """Many simulated hosts in this process's event loop."""

    def __init__(self, plans: Iterable[HostPlan], *, workdir: Path) -> None:
        base = base_config()
        limits = edge_limits_from_env({})
        # One client for every supervisor's calls to its engines, built once all are known.
        self.http: httpx.AsyncClient | None = None
        self.hosts = {
            p.name: FarmHost(p, workdir=workdir, base=base, limits=limits, http=self._client)
            for p in plans
        }
        routes = {port: route for h in self.hosts.values() for port, route in h.model_apps.items()}
        self.http = httpx.AsyncClient(transport=LocalTransport(routes), trust_env=False, timeout=10)
        self.control: Listener | None = None
        self.started_at = time.monotonic()

    def _client(self) -> httpx.AsyncClient:
        assert self.http is not None
        return self.http

    async def start(self, control_port: int) -> None:
        """Listen on every host's ports, then on the control port."""
        raise_descriptor_limit(len(self.hosts) * 8 + 1024)
        for host in self.hosts.values():
            await host.start()
        self.control = Listener(self.control_app(), control_port, base=base_config())
        await self.control.start()

    async def close(self) -> None:
        for host in self.hosts.values():
            host.stop()
        if self.control is not None:
            self.control.stop()
        if self.http is not None:
            await self.http.aclose()

    def stats(self) -> dict[str, Any]:
        return {
            "hosts": len(self.hosts),
            "listeners": sum(len(h.listeners) for h in self.hosts.values()),
            "rssMiB": round(rss_mib(), 1),
            "cpuS": round(cpu_s(), 3),
            "upS": round(time.monotonic() - self.started_at, 1),
        }

    def control_app(self) -> Starlette:
        async def hosts(request: Request) -> JSONResponse:
            return JSONResponse({"hosts": [h.describe() for h in self.hosts.values()]})

        async def fault(request: Request) -> JSONResponse:
            host = self.hosts.get(request.path_params["name"])
            if host is None:
                return _refused(404, f"no host {request.path_params['name']!r}")
            body = await request.body()
            if len(body) > MAX_CONTROL_BODY:
                return _refused(413, f"body over {MAX_CONTROL_BODY} bytes")
            try:
                data = json.loads(body or b"{}")
            except ValueError:
                return _refused(400, "body is not JSON")
            if not isinstance(data, dict):
                return _refused(400, "body must be an object")
            slow_ms = data.get("slowMs", 0)
            if not isinstance(slow_ms, int) or isinstance(slow_ms, bool):
                return _refused(400, f"slowMs must be 0 to {MAX_SLOW_S * 1000:.0f}")
            try:
                await host.set_fault(
                    str(data.get("fault", "")),
                    target=str(data.get("target", "all")),
                    slow_s=slow_ms / 1000,
                )
            except ValueError as exc:
                return _refused(400, str(exc))
            except OSError as exc:
                return _refused(409, f"cannot listen again: {exc.strerror}")
            return JSONResponse(host.describe())

        async def stats(request: Request) -> JSONResponse:
            return JSONResponse(self.stats())

        async def heartbeats(request: Request) -> JSONResponse:
            # time.monotonic() is the machine's CLOCK_MONOTONIC: comparable across processes.
            return JSONResponse(
                {
                    "now": time.monotonic(),
                    "hosts": {name: list(h.heard) for name, h in self.hosts.items()},
                }
            )

        return Starlette(
            routes=[
                Route("/farm/hosts", hosts, methods=["GET"]),
                Route("/farm/hosts/{name}/fault", fault, methods=["POST"]),
                Route("/farm/stats", stats, methods=["GET"]),
                Route("/farm/heartbeats", heartbeats, methods=["GET"]),
            ]
        )


def _refused(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": "invalid_request", "message": message}}, status)
