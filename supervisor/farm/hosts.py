"""One simulated host of the farm: a real supervisor over simulated engines, on its own ports.

The supervisor is the agent's own code (`Host`, the API app, the HTTP edge with its token), its
models are unmanaged servers (nothing spawned), each a `SimEngine` serving the simulator's app
on a port of its own; its GPU is the simulator's (`SimGpuBackend`, one state file per host).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from common.edge.limits import EdgeLimits
from common.edge.protocol import protocol_with
from common.farm_manifest import HostPlan
from supervisor.api import create_app
from supervisor.config import parse_config
from supervisor.farm.listeners import Listener
from supervisor.gpu.sim_backend import SimGpuBackend
from supervisor.gpu.sim_state import SimGpuState
from supervisor.host import Host, HostDeps
from supervisor.sim.engine import SimEngine, build_app
from supervisor.sim.options import SimOptions

GPU_MIB = 81920
GPU_NAME = "SIM-H100-80GB"
# Short latencies, still far above the farm's own costs: a failover at scale takes about a
# second of simulated sleep and wake, as the local launcher's fast policy expects.
ENGINE = {
    "weights_mib": 6144,
    "context_mib": 768,
    "sleep_latency_ms": 200,
    "wake_latency_ms": 400,
    "ttft_ms": 20,
    "token_delay_ms": 2,
}
TARGETS = ("all", "supervisor", "models")
# Heartbeats remembered per host: enough for a benchmark's window at any interval it uses.
HEARD_KEPT = 512


def host_config(plan: HostPlan, workdir: Path) -> dict[str, Any]:
    """The supervisor config of one farm host: one GPU, its models unmanaged on their ports."""
    return {
        "host": plan.name,
        "gpu": {
            "backend": "sim",
            "simStateFile": str(workdir / plan.name / "sim-gpu.json"),
            "simGpus": [{"index": 0, "totalMiB": GPU_MIB, "name": GPU_NAME}],
        },
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [{"name": m.name, "port": m.port} for m in plan.models],
            }
        ],
    }


class FarmHost:
    """A supervisor and its engines, built but not yet listening (`start`)."""

    def __init__(
        self,
        plan: HostPlan,
        *,
        workdir: Path,
        base: uvicorn.Config,
        limits: EdgeLimits,
        http: Callable[[], httpx.AsyncClient],
    ) -> None:
        self.plan = plan
        # Fault tasks the engines' own `crash` started, kept until done (the loop holds weakly).
        self._tasks: set[asyncio.Task[None]] = set()
        config = parse_config(host_config(plan, workdir), cwd=workdir)
        assert config.gpu.sim_state_file is not None
        gpu_state = SimGpuState(config.gpu.sim_state_file)
        self.engines: dict[str, SimEngine] = {}
        self.model_listeners: list[Listener] = []
        self.model_apps: dict[int, tuple[Listener, Any]] = {}
        for m in plan.models:
            options = SimOptions(
                model=m.name,
                port=m.port,
                start_asleep=plan.asleep,
                sim_state=str(config.gpu.sim_state_file),
                **ENGINE,  # type: ignore[arg-type]
            )
            engine = SimEngine(options, gpu_state)
            engine.crash = self._engine_crash(m.port)
            app = build_app(engine)
            listener = Listener(app, m.port, base=base, address=plan.address)
            self.engines[m.name] = engine
            self.model_listeners.append(listener)
            self.model_apps[m.port] = (listener, app)
        self.host = Host(
            config,
            HostDeps(
                gpu=SimGpuBackend(gpu_state, config.gpu.sim_gpus, host=plan.name),
                environ={},
                http_factory=http,
            ),
        )
        # When each `GET /v1/status` arrived (monotonic): how a benchmark sees, from the hosts'
        # side, whether every fleet was heartbeated on time.
        self.heard: collections.deque[float] = collections.deque(maxlen=HEARD_KEPT)
        api = self._recording(create_app(self.host, token=plan.token, manage_host=False))
        edge = protocol_with(
            limits, body_setting="HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES", token=plan.token
        )
        self.supervisor = Listener(api, plan.port, base=base, protocol=edge, address=plan.address)

    @property
    def listeners(self) -> list[Listener]:
        return [self.supervisor, *self.model_listeners]

    async def start(self) -> None:
        """Publish the engines' GPU memory, start the supervisor's host, then listen."""
        for engine in self.engines.values():
            engine.register_memory()
        await self.host.start()
        for listener in self.listeners:
            await listener.start()

    def stop(self) -> None:
        for listener in self.listeners:
            listener.stop()

    async def set_fault(self, fault: str, *, target: str = "all", slow_s: float = 0.0) -> None:
        """Apply `fault` to the supervisor, the model servers, or both (`all`)."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
        chosen = {
            "all": self.listeners,
            "supervisor": [self.supervisor],
            "models": self.model_listeners,
        }[target]
        for listener in chosen:
            await listener.set_fault(fault, slow_s)

    def describe(self) -> dict[str, Any]:
        """The host as the farm's control API lists it (never its token)."""
        return {
            "name": self.plan.name,
            "url": self.plan.url,
            "supervisor": {"fault": self.supervisor.fault, "listening": self.supervisor.listening},
            "models": [
                {
                    "name": name,
                    "servingUrl": self.plan.serving_url(name),
                    "fault": listener.fault,
                    "listening": listener.listening,
                    "sleeping": engine.sleeping,
                    "requests": engine.stats.requests,
                }
                for (name, engine), listener in zip(
                    self.engines.items(), self.model_listeners, strict=True
                )
            ],
        }

    def _recording(self, app: Any) -> Any:
        heard = self.heard

        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == "/v1/status":
                heard.append(time.monotonic())
            await app(scope, receive, send)

        return recorded

    def _engine_crash(self, port: int) -> Callable[[], None]:
        """The sim's `crash` fault in the farm: this engine stops, the farm goes on."""

        def crash() -> None:
            listener, _ = self.model_apps[port]
            task = asyncio.get_running_loop().create_task(listener.set_fault("crash"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return crash
