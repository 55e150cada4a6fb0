"""Scriptable stand-ins for the supervisor's I/O: process spawner and NVML.

Test code: the shipped package never imports it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from supervisor.gpu.facts import MIB

# -- processes ---------------------------------------------------------------------------------


class FakeChild:
    """A child process that exits when told to, or when signalled as scripted."""

    def __init__(self, pid: int, argv: Sequence[str], env: Mapping[str, str], *, obeys_term: bool):
        self.pid = pid
        self.argv = tuple(argv)
        self.env = dict(env)
        self.obeys_term = obeys_term
        self.signals: list[int] = []
        self._code: int | None = None
        self._done = asyncio.Event()

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        await self._done.wait()
        assert self._code is not None
        return self._code

    def exit(self, code: int) -> None:
        if self._code is None:
            self._code = code
            self._done.set()

    def signal_group(self, sig: int) -> bool:
        self.signals.append(sig)
        if self._code is not None:
            return False
        if sig == signal.SIGKILL:
            self.exit(-signal.SIGKILL)
        elif sig == signal.SIGTERM and self.obeys_term:
            self.exit(0)
        return True


@dataclass
class FakeSpawner:
    """Record every spawn; fail with `fail_with`, or hand out FakeChild processes."""

    obeys_term: bool = True
    fail_with: BaseException | None = None
    spawned: list[FakeChild] = field(default_factory=list)
    _pids: Any = field(default_factory=lambda: itertools.count(40_000))

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None
    ) -> FakeChild:
        if self.fail_with is not None:
            raise self.fail_with
        child = FakeChild(next(self._pids), argv, env, obeys_term=self.obeys_term)
        self.spawned.append(child)
        return child


# -- NVML --------------------------------------------------------------------------------------


class FakeNvmlError(Exception):
    """Mimic pynvml.NVMLError: carries the NVML error code in `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


NOT_SUPPORTED = 3
NOT_FOUND = 6
LIBRARY_NOT_FOUND = 12


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # pynvml's attribute name


@dataclass
class FakeMemory:
    total: int
    used: int

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass
class FakeMig:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    used_mib: int
    total_mib: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total_mib: int
    used_mib: int
    cc: tuple[int, int] = (9, 0)
    processes: list[FakeProcess] = field(default_factory=list)
    # A MIG GPU: the parent's memory query is unsupported and these instances hold the memory.
    migs: list[FakeMig] | None = None
    names_as_bytes: bool = False
    # An NVML error code the process lists fail with (a sandbox that hides other processes).
    process_error: int | None = None


class FakeNvml:
    """A scripted `pynvml` module: the subset of its API the NVML backend uses."""

    NVMLError = FakeNvmlError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.fail_queries_with: int | None = None

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        if self.fail_queries_with is not None:
            raise FakeNvmlError(self.fail_queries_with)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ("gpu", index)

    def _gpu(self, handle: Any) -> FakeGpu:
        return self.gpus[handle[1]]

    def _text(self, gpu: FakeGpu, value: str) -> Any:
        return value.encode() if gpu.names_as_bytes else value

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return self._text(self._gpu(handle), self._gpu(handle).name)

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        if handle[0] == "mig":
            return self._mig(handle).uuid
        return self._text(self._gpu(handle), self._gpu(handle).uuid)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle).cc

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> FakeMemory:
        if handle[0] == "mig":
            mig = self._mig(handle)
            return FakeMemory(mig.total_mib * MIB, mig.used_mib * MIB)
        gpu = self._gpu(handle)
        if gpu.migs is not None:
            raise FakeNvmlError(NOT_SUPPORTED)
        return FakeMemory(gpu.total_mib * MIB, gpu.used_mib * MIB)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.migs is None:
            raise FakeNvmlError(NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        migs = self._gpu(handle).migs or []
        if slot >= len(migs):
            raise FakeNvmlError(NOT_FOUND)
        return ("mig", handle[1], slot)

    def _mig(self, handle: Any) -> FakeMig:
        migs = self.gpus[handle[1]].migs
        assert migs is not None
        return migs[handle[2]]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig(handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig(handle).compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProcess]:
        if handle[0] == "mig":
            return self._mig(handle).processes
        gpu = self._gpu(handle)
        if gpu.migs is not None:
            # Under MIG, processes are listed per instance, not on the parent.
            raise FakeNvmlError(NOT_SUPPORTED)
        if gpu.process_error is not None:
            raise FakeNvmlError(gpu.process_error)
        return gpu.processes

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[FakeProcess]:
        if handle[0] == "gpu" and self._gpu(handle).process_error is not None:
            raise FakeNvmlError(self._gpu(handle).process_error)
        return []


# -- model servers on loopback ports (an httpx transport) ----------------------------------------


@dataclass
class FakeServerState:
    """One scripted model server: its sleep flag and what its endpoints should do."""

    name: str
    sleeping: bool = False
    reachable: bool = True
    is_sleeping_value: Any = None  # overrides the boolean reply when set (e.g. "yes")
    sleep_status: int = 200
    wake_status: int = 200
    delay_s: float = 0.0
    reply: str = "pong"
    chat_status: int = 200
    # What GET /metrics reports as running, one reading per call (the last one repeats);
    # empty: no /metrics (404), like a server whose load cannot be read.
    running: list[int] = field(default_factory=list)
    # Like vLLM's --api-key: chat completions need this bearer key when set.
    api_key: str | None = None
    calls: list[str] = field(default_factory=list)
    sleep_queries: list[str] = field(default_factory=list)
    # What GET /version answers (vLLM's); None: 404, like an engine that does not say.
    version: str | None = None
    # Every chat completion body received, parsed (a golden probe's fields are checked on it).
    chat_bodies: list[Any] = field(default_factory=list)


class FakeModelServers:
    """An httpx transport handler answering for model servers on 127.0.0.1:<port>.

    Speaks the vLLM control endpoints, SGLang's release/resume and a minimal chat completion,
    so a Host can be driven without processes: `httpx.AsyncClient(transport=MockTransport(f))`.
    """

    def __init__(self, servers: Mapping[int, FakeServerState]) -> None:
        self.servers = dict(servers)

    async def __call__(self, request: Any) -> Any:
        server = self.servers.get(request.url.port)
        if server is None or not server.reachable or request.url.host != "127.0.0.1":
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        server.calls.append(f"{request.method} {path}")
        if server.delay_s:
            await asyncio.sleep(server.delay_s)
        if path == "/metrics" and server.running:
            now = server.running.pop(0) if len(server.running) > 1 else server.running[0]
            return httpx.Response(200, text=f'vllm:num_requests_running{{model_name="x"}} {now}\n')
        if path in ("/sleep", "/release_memory_occupation"):
            server.sleep_queries.append(request.url.query.decode())
            if server.sleep_status == 200:
                server.sleeping = True
            return httpx.Response(
                server.sleep_status, text="" if server.sleep_status == 200 else "boom"
            )
        if path in ("/wake_up", "/resume_memory_occupation"):
            if server.wake_status == 200:
                server.sleeping = False
            return httpx.Response(
                server.wake_status, text="" if server.wake_status == 200 else "boom"
            )
        if path == "/is_sleeping":
            value = (
                server.sleeping if server.is_sleeping_value is None else server.is_sleeping_value
            )
            return httpx.Response(200, json={"is_sleeping": value})
        if path == "/health":
            return httpx.Response(200)
        if path == "/version" and server.version is not None:
            return httpx.Response(200, json={"version": server.version})
        if path == "/v1/chat/completions":
            server.chat_bodies.append(json.loads(request.content or b"{}"))
            if (
                server.api_key
                and request.headers.get("authorization") != f"Bearer {server.api_key}"
            ):
                return httpx.Response(401, json={"error": "Unauthorized"})
            if server.sleeping:
                return httpx.Response(503, json={"error": {"message": "sleeping"}})
            if server.chat_status != 200:
                return httpx.Response(server.chat_status, text="upstream error")
            message = {"role": "assistant", "content": server.reply}
            # ASCII JSON: a reply may carry a lone surrogate, which only an escape can write.
            reply = json.dumps({"choices": [{"index": 0, "message": message}]})
            return httpx.Response(200, text=reply, headers={"content-type": "application/json"})
        return httpx.Response(404)
