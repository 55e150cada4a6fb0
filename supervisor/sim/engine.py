"""The simulated model server: OpenAI inference, vLLM's sleep endpoints, injectable faults.

It is a real HTTP server and is also the upstream of the chat proxy benchmark, so the
non-streaming path with zero delays does no more than parse, answer and count.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from supervisor.gpu.sim_state import SimGpuState
from supervisor.sim.backends import WAKE_TAGS, SimBackend
from supervisor.sim.inference import InferenceEndpoint

log = logging.getLogger("supervisor.sim")

FAULT_NAMES = {
    "wakeFails": "wake_fails",
    "wakeHangs": "wake_hangs",
    "sleepFails": "sleep_fails",
    "inference5xx": "inference_5xx",
    "isSleepingGarbage": "is_sleeping_garbage",
    "crash": "crash",
}


@dataclass
class SimOptions:
    model: str
    port: int
    host: str = "127.0.0.1"
    weights_mib: int = 0
    context_mib: int = 0
    gpu_index: int = 0
    sim_state: str | None = None
    wake_latency_ms: int = 0
    sleep_latency_ms: int = 0
    ttft_ms: int = 0
    token_delay_ms: int = 0
    load_ms: int = 0
    reply: str | None = None
    echo: bool = False
    start_asleep: bool = False
    backend: str = "sim"
    # The torch backend's own settings (device, KV cache, weights file); empty for "sim".
    backend_settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Faults:
    wake_fails: bool = False
    wake_hangs: bool = False
    sleep_fails: bool = False
    inference_5xx: bool = False
    is_sleeping_garbage: bool = False
    crash: bool = False

    def to_json(self) -> dict[str, bool]:
        return {wire: getattr(self, attr) for wire, attr in FAULT_NAMES.items()}


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    rejected: int = 0
    inflight: int = 0
    sleeps: int = 0
    wakes: int = 0


@dataclass
class LastRequest:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    at: float = field(default_factory=time.time)


class SimEngine:
    """The engine's state: awake or asleep, memory held, faults, counters."""

    # A request that arrives while asleep waits this long for a wake before it is refused.
    HOLD_S = 600.0

    def __init__(
        self,
        options: SimOptions,
        state: SimGpuState | None = None,
        backend: SimBackend | None = None,
    ) -> None:
        self.options = options
        self.state = state
        self.backend = backend
        self.sleeping = options.start_asleep
        # What a sleep took away and a wake has not brought back yet (vLLM's wake tags).
        self.asleep_tags: set[str] = set(WAKE_TAGS) if options.start_asleep else set()
        self.awake = asyncio.Event()
        if not self.sleeping:
            self.awake.set()
        self.sleep_level: int | None = 1 if options.start_asleep else None
        self.loaded = options.load_ms <= 0 and backend is None
        self.faults = Faults()
        self.stats = Stats()
        self.last_request: LastRequest | None = None
        self._ids = itertools.count(1)
        self._transition = asyncio.Lock()
        self._faults_changed = asyncio.Event()
        self.reply = options.reply or f"Hello from {options.model}, a simulated model server."

    # -- memory ---------------------------------------------------------------------------------

    def register_memory(self) -> None:
        """Publish what this process holds: context always, weights while awake."""
        if self.state is None:
            return
        o = self.options
        self.state.hold(o.gpu_index, o.context_mib, f"context:{o.model}")
        self.state.hold(o.gpu_index, 0 if self.sleeping else o.weights_mib, f"weights:{o.model}")

    def release_memory(self) -> None:
        if self.state is not None:
            self.state.release()

    # -- sleep and wake -------------------------------------------------------------------------

    @property
    def holds_while_asleep(self) -> bool:
        """Hold requests that arrive while asleep until the wake, as vLLM does (real backends)."""
        return self.backend is not None

    async def sleep(self, level: int) -> Response:
        async with self._transition:
            if self.faults.sleep_fails:
                return _error(500, "simulated sleep failure")
            if not self.sleeping:
                await asyncio.sleep(self.options.sleep_latency_ms / 1000)
                if self.backend is not None:
                    await asyncio.to_thread(self.backend.sleep, level)
                self.awake.clear()
                self.asleep_tags = set(WAKE_TAGS)
                self.sleeping = True
                self.sleep_level = level
                self.stats.sleeps += 1
                self.register_memory()
                log.info("%s: asleep (level %s)", self.options.model, level)
        if self.backend is None:
            return Response(status_code=200)
        return JSONResponse({"status": "sleeping", "level": self.sleep_level})

    async def wake(self, tags: tuple[str, ...] | None = None) -> Response:
        async with self._transition:
            while self.faults.wake_hangs:
                # Hang until the fault is cleared, like a wake stuck on a busy GPU.
                self._faults_changed.clear()
                await self._faults_changed.wait()
            if self.faults.wake_fails:
                return _error(500, "simulated wake failure")
            if self.sleeping:
                await asyncio.sleep(self.options.wake_latency_ms / 1000)
                wanted = frozenset(tags or WAKE_TAGS)
                if self.backend is not None:
                    await asyncio.to_thread(self.backend.wake, wanted)
                self.asleep_tags -= wanted
            if self.sleeping and not self.asleep_tags:
                self.sleeping = False
                self.sleep_level = None
                self.stats.wakes += 1
                self.register_memory()
                self.awake.set()
                log.info("%s: awake", self.options.model)
        if self.backend is None:
            return Response(status_code=200)
        status = "sleeping" if self.sleeping else "awake"
        return JSONResponse({"status": status, "tags": list(tags) if tags else None})

    async def backend_facts(self, *, checksum: bool) -> dict[str, Any] | None:
        """The backend's memory facts; under the transition lock, so never mid-sleep."""
        if self.backend is None:
            return None
        async with self._transition:
            return await asyncio.to_thread(self.backend.describe, checksum=checksum)

    def set_faults(self, changes: dict[str, Any]) -> str | None:
        """Apply fault flags from the wire; return an error message for bad input."""
        for key, value in changes.items():
            if key not in FAULT_NAMES:
                return f"unknown fault {key!r} (known: {', '.join(FAULT_NAMES)})"
            if not isinstance(value, bool):
                return f"fault {key!r} must be true or false"
        for key, value in changes.items():
            setattr(self.faults, FAULT_NAMES[key], value)
        self._faults_changed.set()
        return None

    def record_request(self, scope: Any, body: bytes) -> None:
        """Keep the last inference request verbatim, so a proxy test can compare bytes."""
        self.last_request = LastRequest(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]],
            body=body,
        )

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-sim-{next(self._ids)}"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


# -- control and inspection routes ---------------------------------------------------------------


def _local_only(request: Request) -> Response | None:
    client = request.client.host if request.client else ""
    try:
        if ipaddress.ip_address(client).is_loopback:
            return None
    except ValueError:
        pass
    return _error(403, "simulator controls are local-only")


def build_app(engine: SimEngine) -> Starlette:
    """Build the simulated server's ASGI app around one engine."""

    async def health(request: Request) -> Response:
        return Response(status_code=200 if engine.loaded else 503)

    async def models(request: Request) -> Response:
        created = int(time.time())
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": engine.options.model,
                        "object": "model",
                        "created": created,
                        "owned_by": "haru-sim",
                    }
                ],
            }
        )

    async def metrics(request: Request) -> Response:
        s, m = engine.stats, engine.options.model
        label = f'{{model_name="{m}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {s.inflight}",
            "# TYPE haru_sim_requests_total counter",
            f"haru_sim_requests_total{label} {s.requests}",
            "# TYPE haru_sim_requests_completed_total counter",
            f"haru_sim_requests_completed_total{label} {s.completed}",
            "# TYPE haru_sim_requests_cancelled_total counter",
            f"haru_sim_requests_cancelled_total{label} {s.cancelled}",
            "# TYPE haru_sim_sleeping gauge",
            f"haru_sim_sleeping{label} {int(engine.sleeping)}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def sleep(request: Request) -> Response:
        raw = request.query_params.get("level", "1")
        if raw not in ("1", "2"):
            return _error(400, f"level must be 1 or 2, got {raw!r}")
        return await engine.sleep(int(raw))

    async def wake_up(request: Request) -> Response:
        tags = tuple(request.query_params.getlist("tags"))
        unknown = [t for t in tags if t not in WAKE_TAGS]
        if unknown:
            return _error(400, f"unknown wake tags {unknown} (known: {', '.join(WAKE_TAGS)})")
        return await engine.wake(tags or None)

    async def backend(request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        checksum = request.query_params.get("checksum") in ("1", "true")
        facts = await engine.backend_facts(checksum=checksum)
        if facts is None:
            return _error(404, "this engine runs no memory backend (start it with --backend)")
        return JSONResponse(facts)

    async def is_sleeping(request: Request) -> Response:
        if engine.faults.is_sleeping_garbage:
            return JSONResponse({"is_sleeping": "unknown"})
        return JSONResponse({"is_sleeping": engine.sleeping})

    async def faults(request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
            except ValueError:
                return _error(400, "body is not valid JSON")
            if not isinstance(changes, dict):
                return _error(400, "body must be an object")
            problem = engine.set_faults(changes)
            if problem:
                return _error(400, problem)
            if engine.faults.crash:
                log.warning("%s: simulated crash", engine.options.model)
                # Answer first, then die without cleanup, as a real crash would.
                asyncio.get_running_loop().call_later(0.05, os._exit, 70)
        return JSONResponse(engine.faults.to_json())

    async def stats(request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        s = engine.stats
        return JSONResponse(
            {
                "model": engine.options.model,
                "requests": s.requests,
                "completed": s.completed,
                "cancelled": s.cancelled,
                "rejected": s.rejected,
                "inflight": s.inflight,
                "sleeps": s.sleeps,
                "wakes": s.wakes,
                "sleeping": engine.sleeping,
                "sleepLevel": engine.sleep_level,
                "loaded": engine.loaded,
                "weightsMiB": engine.options.weights_mib,
                "contextMiB": engine.options.context_mib,
                "gpuIndex": engine.options.gpu_index,
                "pid": os.getpid(),
            }
        )

    async def last_request(request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        last = engine.last_request
        if last is None:
            return _error(404, "no inference request received yet")
        if request.query_params.get("raw") in ("1", "true"):
            return Response(last.body, media_type="application/octet-stream")
        return JSONResponse(
            {
                "method": last.method,
                "path": last.path,
                "query": last.query,
                "headers": [list(h) for h in last.headers],
                "bodyBase64": base64.b64encode(last.body).decode(),
                "bodyBytes": len(last.body),
                "at": last.at,
            }
        )

    async def reset(request: Request) -> Response:
        if (refused := _local_only(request)) is not None:
            return refused
        engine.stats = Stats(inflight=engine.stats.inflight)
        engine.last_request = None
        engine.set_faults({k: False for k in FAULT_NAMES})
        return JSONResponse({"ok": True})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader: asyncio.Task[None] | None = None
        if engine.loaded:
            engine.register_memory()
        else:
            loader = asyncio.create_task(_load(engine))
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
            engine.release_memory()
            if engine.backend is not None:
                engine.backend.close()

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", InferenceEndpoint(engine, chat=True)),
            Route("/v1/completions", InferenceEndpoint(engine, chat=False)),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/sleep", sleep, methods=["POST"]),
            Route("/wake_up", wake_up, methods=["POST"]),
            Route("/is_sleeping", is_sleeping, methods=["GET"]),
            Route("/_sim/faults", faults, methods=["GET", "POST"]),
            Route("/_sim/stats", stats, methods=["GET"]),
            Route("/_sim/backend", backend, methods=["GET"]),
            Route("/_sim/last-request", last_request, methods=["GET"]),
            Route("/_sim/reset", reset, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


async def _load(engine: SimEngine) -> None:
    await asyncio.sleep(engine.options.load_ms / 1000)
    if engine.backend is not None:
        await asyncio.to_thread(engine.backend.allocate)
        if engine.sleeping:  # --start-asleep: load, then sleep, as a standby would
            await asyncio.to_thread(engine.backend.sleep, 1)
    engine.loaded = True
    engine.register_memory()
    log.info("%s: loaded", engine.options.model)
