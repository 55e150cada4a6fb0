"""A scripted supervisor: an in-memory host behind httpx.MockTransport, speaking the wire contract.

It models what the executors look at (models asleep or awake, trainers and their PIDs, GPU
memory with the processes holding it, as `supervisor/gpu/facts.py` writes it) and counts both
the calls it receives and the effects they have (a wake that actually woke something), so tests
can assert "each step's effect happened once". Faults are flags.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from common.wire.shape import FEATURES

TOTAL_MIB = 81920
WEIGHTS_MIB = 6000
CONTEXT_MIB = 700
TRAINER_MIB = 40000
_pids = itertools.count(4000)


@dataclass
class FakeHost:
    """One simulated GPU host; `models` maps name -> sleeping."""

    models: dict[str, bool]
    trainer: str = "idle"  # idle | running | stopping
    pid: int | None = None
    token: str | None = None
    # faults
    down: bool = False  # the supervisor refuses connections (its process is gone)
    # Model servers refusing connections; None: as `down` says (the whole host is gone).
    servers_down: set[str] | None = None
    # Every call (supervisor and model servers) times out: a partition, not a dead host.
    partitioned: bool = False
    # Only the supervisor's calls time out (a partition between the control plane and the
    # supervisor, or a supervisor too slow or saturated to answer); model servers answer.
    supervisor_partitioned: bool = False
    unauthorized: bool = False
    bad_body: bool = False
    wake_fails: bool = False
    wake_noop: bool = False  # answers 200 but nothing wakes (a hung engine behind it)
    sleep_fails: bool = False  # POST /v1/vllm/sleep answers 502: the models stay awake
    start_fails: bool = False  # POST /v1/training/start answers 502: the trainer stays idle
    # "METHOD /path" -> how many more of those calls answer 502 (then as usual): a fault that
    # heals after a given number of attempts.
    failing: Counter = field(default_factory=Counter)
    probe_fails: set[str] = field(default_factory=set)
    stop_polls: int = 0  # status reads a stop takes before the trainer is gone
    # The stop answers as ours does: every trainer's state after it, a trainer that stops at
    # once (no `stop_polls`) already gone.
    stop_lists_trainers: bool = False
    ignore_stop: bool = False  # the trainer never exits
    start_without_pid: bool = False  # "running" with no PID: must never count
    leak_mib: int = 0
    gpu_unavailable: bool = False  # GET /v1/gpu/memory answers 501 (no NVML on this host)
    gpu_fails: bool = False  # GET /v1/gpu/memory answers 502 (an NVML query failed)
    gpu_bad_body: bool = False  # GET /v1/gpu/memory answers a body off the contract
    gpu_gate: threading.Event | None = None  # GET /v1/gpu/memory hangs until this is set
    checkpoint_at: str | None = None  # the trainer's lastCheckpointAt, when it has one
    adapter_at: str | None = None  # its lastAdapterAt (a completed adapter), when it has one
    # Golden probes: with `golden`, a seeded probe answers `answers[model]` (default "Hello from
    # <model>") with `engine_version`; the status reports `engine_version` when set.
    golden: bool = False
    answers: dict[str, str] = field(default_factory=dict)
    engine_version: str | None = None
    model_pids: dict[str, int] = field(default_factory=dict)
    # What GET /v1/status advertises beyond the original contract (ours: FEATURES).
    features: tuple[str, ...] = FEATURES
    # Behave as the original supervisor: strict request bodies (its schemas, 400 otherwise),
    # its answers, its model selector in the query, no features.
    original: bool = False
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    # The adapter API (tests/reconciler/fake_adapters.py; add "adapters" to `features` too).
    adapter_store: Any = None
    # Model swaps (`POST /v1/models/swap`, feature model.swap): each switches at once (or
    # fails, with `swap_fails`); `ports` and `profiles` are what each model serves from then.
    swap_fails: bool = False
    swap_refused: bool = False  # 400: the profile is refused
    swaps: dict[str, dict] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    profiles: dict[str, dict] = field(default_factory=dict)
    next_swap_port: int = 18100
    # accounting
    calls: Counter = field(default_factory=Counter)
    effects: Counter = field(default_factory=Counter)
    _stopping_left: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name in sorted(self.models):
            self.model_pids.setdefault(name, next(_pids))

    def used_mib(self) -> int:
        used = self.leak_mib
        used += sum(CONTEXT_MIB if asleep else WEIGHTS_MIB for asleep in self.models.values())
        if self.trainer != "idle":
            used += TRAINER_MIB
        return used

    def _status(self) -> dict:
        if self.trainer == "stopping" and not self.ignore_stop:
            if self._stopping_left <= 0:
                self.trainer, self.pid = "idle", None
                self.effects["trainer_exited"] += 1
            else:
                self._stopping_left -= 1
        return {
            "slots": [
                {
                    "gpuIndex": 0,
                    "kind": "inference",
                    "models": [
                        {
                            "name": n,
                            "port": self.ports.get(n, 18000 + i),
                            **({"swap": self.swaps[n]} if n in self.swaps else {}),
                            # A server that refuses: its supervisor cannot read it.
                            "sleeping": None if self.servers_down and n in self.servers_down else s,
                            "process": {"pid": self.model_pids[n]},
                            **(
                                {"engineVersion": self.engine_version}
                                if self.engine_version
                                else {}
                            ),
                        }
                        for i, (n, s) in enumerate(sorted(self.models.items()))
                    ],
                },
                {
                    "gpuIndex": 0,
                    "kind": "training",
                    "training": {
                        "state": self.trainer,
                        "pids": [self.pid] if self.pid is not None else [],
                        "lastCheckpointAt": self.checkpoint_at,
                        **({"lastAdapterAt": self.adapter_at} if self.adapter_at else {}),
                    },
                },
            ],
            "ready": True,
            "features": list(self.features),
        }

    def _gpu_memory(self) -> dict:
        processes = [
            {
                "pid": self.model_pids[n],
                "usedMiB": CONTEXT_MIB if asleep else WEIGHTS_MIB,
                "name": f"model {n}",
            }
            for n, asleep in sorted(self.models.items())
        ]
        if self.trainer != "idle" and self.pid is not None:
            processes.append({"pid": self.pid, "usedMiB": TRAINER_MIB, "name": "trainer"})
        return {
            "gpus": [
                {
                    "index": 0,
                    "usedMiB": self.used_mib(),
                    "totalMiB": TOTAL_MIB,
                    "name": "NVIDIA H100 80GB HBM3",
                    "uuid": "GPU-fake-0",
                    "computeCapability": "9.0",
                    "processes": processes,
                    "mig": None,
                }
            ],
            "backend": "fake",
        }

    def refuses(self, model: str) -> bool:
        """Whether `model`'s own server refuses connections."""
        return self.down if self.servers_down is None else model in self.servers_down

    def serve_health(self, model: str, request: httpx.Request) -> httpx.Response:
        """A model server's `GET /health`, asked directly by the reconciler."""
        with self.lock:
            self.calls[f"health {model}"] += 1
            if self.partitioned:
                raise httpx.ConnectTimeout("timed out", request=request)
            if self.refuses(model):
                raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        with self.lock:
            self.calls[f"{request.method} {path}"] += 1
            if self.partitioned or self.supervisor_partitioned:
                raise httpx.ConnectTimeout("timed out", request=request)
        gate = self.gpu_gate
        if path == "/v1/gpu/memory" and gate is not None:
            gate.wait(10)  # outside the lock: a hung GPU read must not hold up the status
        with self.lock:
            if self.down:
                raise httpx.ConnectError("connection refused", request=request)
            auth = request.headers.get("authorization")
            if self.unauthorized or (self.token and auth != f"Bearer {self.token}"):
                return _error(401, "unauthorized", "missing or wrong bearer token")
            if self.bad_body:
                return httpx.Response(200, content=b'{"slots": "nope"')
            body = json.loads(request.content or b"{}") if request.method == "POST" else {}
            self.requests.append((request.method, str(request.url), body))
            if self.original:
                return self._original(request, path, body)
            if self.adapter_store is not None and path.startswith("/v1/adapters"):
                return self.adapter_store.handle(self, request, body)
            answer = self._route(request.method, path, body)
            if self.adapter_store is not None and path == "/v1/probe" and answer.status_code == 200:
                adapted = answer.json()
                adapted["results"] += self.adapter_store.probe_results(self, body)
                return httpx.Response(200, json=adapted)
            return answer

    def _original(self, request: httpx.Request, path: str, body: dict) -> httpx.Response:
        """The original supervisor's behaviour, from its published schemas and routes."""
        schema = ORIGINAL_REQUESTS.get(path)
        if request.method == "POST" and schema is not None:
            refused = list(_original_schema(schema).iter_errors(body))
            if refused:
                return _error(400, "invalid_request", refused[0].message)
        if path == "/v1/status":
            status = self._status()
            for slot in status["slots"]:
                for model in slot.get("models", ()):
                    model.pop("process", None)
            status.pop("features")
            status["ready"] = all(not s for s in self.models.values())
            return httpx.Response(200, json=status)
        if path == "/v1/gpu/memory":
            self._status()
            gpus = [{"index": 0, "usedMiB": self.used_mib(), "totalMiB": TOTAL_MIB}]
            return httpx.Response(200, json={"gpus": gpus})
        if path == "/v1/training/start" and self.trainer == "stopping":
            return httpx.Response(200, json={"status": "ok"})  # a no-op there
        if path == "/v1/probe":
            selected = request.url.params.get_list("model") or list(self.models)
            answer = self._route("POST", path, {**body, "models": selected}).json()
            for result in answer["results"]:
                if result["error"] is None:
                    del result["error"]  # absent when ok, never null
            return httpx.Response(200, json=answer)
        answer = self._route(request.method, path, body)
        if answer.status_code < 300 and path != "/v1/training/stop":
            return httpx.Response(200, json={"status": "ok"})
        if answer.status_code < 300:
            return httpx.Response(202, json={"status": "ok"})
        return answer

    def _route(self, method: str, path: str, body: dict) -> httpx.Response:
        if self.failing[f"{method} {path}"] > 0:
            self.failing[f"{method} {path}"] -= 1
            return _error(502, "upstream_error", f"{method} {path} failed")
        if (method, path) == ("GET", "/v1/status"):
            return httpx.Response(200, json=self._status())
        if (method, path) == ("GET", "/v1/gpu/memory"):
            if self.gpu_unavailable:
                return _error(501, "gpu_unavailable", "NVML library not found")
            if self.gpu_fails:
                return _error(502, "gpu_query_failed", "nvmlDeviceGetMemoryInfo: GPU is lost")
            if self.gpu_bad_body:
                return httpx.Response(200, json={"gpus": [{"index": 0, "usedMiB": "lots"}]})
            self._status()  # a stop in progress moves on with time, as reads go by
            return httpx.Response(200, json=self._gpu_memory())
        if (method, path) == ("POST", "/v1/vllm/wake"):
            if self.wake_fails:
                failures = [{"model": n, "gpuIndex": 0, "error": "HTTP 500"} for n in self.models]
                return _error(502, "wake_failed", "wake failed for every model", failures=failures)
            if not self.wake_noop:
                for name, asleep in self.models.items():
                    if asleep:
                        self.models[name] = False
                        self.effects["woke"] += 1
            return httpx.Response(200, json={"ok": True, "action": "wake"})
        if (method, path) == ("POST", "/v1/vllm/sleep"):
            if self.sleep_fails:
                return _error(502, "sleep_failed", "sleep failed for every model")
            for name, asleep in self.models.items():
                if not asleep:
                    self.models[name] = True
                    self.effects["slept"] += 1
            return httpx.Response(200, json={"ok": True, "action": "sleep"})
        if (method, path) == ("POST", "/v1/training/stop"):
            if self.trainer == "running":
                self.trainer = "stopping"
                self._stopping_left = self.stop_polls
                self.effects["trainer_stopped"] += 1
            if not self.stop_lists_trainers:
                return httpx.Response(202, json={"slots": []})
            if self.trainer == "stopping" and not self.stop_polls and not self.ignore_stop:
                self.trainer, self.pid = "idle", None
                self.effects["trainer_exited"] += 1
            listed = {"gpuIndex": 0, "state": self.trainer, "pids": [self.pid] if self.pid else []}
            return httpx.Response(202, json={"status": "ok", "slots": [listed]})
        if (method, path) == ("POST", "/v1/training/start"):
            if self.start_fails:
                return _error(502, "training_start_failed", "the trainer exited at start")
            if self.trainer == "stopping":
                return _error(409, "training_stopping", "still stopping")
            if self.trainer == "idle":
                self.trainer = "running"
                self.pid = None if self.start_without_pid else next(_pids)
                self.effects["trainer_started"] += 1
            return httpx.Response(202, json={"slots": []})
        if (method, path) == ("POST", "/v1/models/swap"):
            return self._swap(body)
        if (method, path) == ("POST", "/v1/probe"):
            names = body.get("models") or list(self.models)
            unknown = [n for n in names if n not in self.models]
            if unknown:
                return _error(404, "invalid_target", f"unknown model(s): {', '.join(unknown)}")
            results = []
            for n in names:
                ok = not self.models[n] and n not in self.probe_fails
                error = None if ok else ("asleep" if self.models[n] else "HTTP 500: boom")
                result = {"model": n, "ok": ok, "latencyMs": 3, "error": error}
                if ok and self.golden and "seed" in body:
                    result["answer"] = self.answers.get(n, f"Hello from {n}")
                    if self.engine_version:
                        result["engineVersion"] = self.engine_version
                results.append(result)
            self.effects["probed"] += 1
            return httpx.Response(
                200, json={"ok": all(r["ok"] for r in results), "results": results}
            )
        return _error(404, "not_found", f"no route {path}")


def _swap_of(host: FakeHost, body: dict) -> httpx.Response:
    name, mode = body.get("model"), body.get("mode")
    if name not in host.models:
        return _error(404, "invalid_target", f"unknown model {name!r}")
    if host.swap_refused:
        return _error(400, "invalid_request", "profile.engine: unknown engine")
    index = sorted(host.models).index(name)
    previous = host.ports.get(name, 18000 + index)
    port = previous if mode == "in-place" else host.next_swap_port
    if mode != "in-place":
        host.next_swap_port += 1
    state = "failed" if host.swap_fails else "switched"
    host.swaps[name] = {
        "state": state,
        "mode": mode,
        "port": port,
        "previousPort": previous,
        "startedAt": f"2026-01-01T00:00:{len(host.requests):02d}Z",
        **({"error": "probing: HTTP 500"} if host.swap_fails else {}),
    }
    host.effects["swap_requested"] += 1
    if not host.swap_fails:
        host.ports[name] = port
        host.profiles[name] = body.get("profile") or {}
        host.models[name] = False  # a swapped server starts awake
        host.effects["swapped"] += 1
    answer = {"status": "swapping", "model": name, "mode": mode, "port": port}
    return httpx.Response(202, json={**answer, "previousPort": previous})


FakeHost._swap = _swap_of  # type: ignore[attr-defined]


ORIGINAL_SCHEMAS = Path(__file__).resolve().parents[1] / "wire" / "original"
ORIGINAL_REQUESTS = {
    "/v1/vllm/sleep": "target.request",
    "/v1/vllm/wake": "target.request",
    "/v1/training/stop": "training-stop.request",
    "/v1/probe": "probe.request",
}


@functools.cache
def _original_schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((ORIGINAL_SCHEMAS / f"{name}.json").read_text()))


def _error(status: int, code: str, message: str, **extra) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, **extra}})


class FakeFleet:
    """Route requests to fake hosts by port: east on 8701, west on 8702 (the example layout)."""

    # The example layout's model servers: port -> (host, model).
    SERVERS = {
        18002: ("east", "llama-small"),
        18001: ("east", "qwen-small"),
        18012: ("west", "llama-small"),
        18011: ("west", "qwen-small"),
    }

    def __init__(self, **hosts: FakeHost) -> None:
        self.hosts = hosts
        self.by_port = {8701: hosts.get("east"), 8702: hosts.get("west")}

    def handle(self, request: httpx.Request) -> httpx.Response:
        server = self.SERVERS.get(request.url.port or 0)
        if server is not None and server[0] in self.hosts and request.url.path == "/health":
            return self.hosts[server[0]].serve_health(server[1], request)
        host = self.by_port.get(request.url.port)
        if host is None:
            raise httpx.ConnectError("no such host", request=request)
        return host.handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


def standby_posture_fleet() -> FakeFleet:
    """East serving with training off; west asleep with its trainer running: the seeded demo."""
    models = ("llama-small", "qwen-small")
    return FakeFleet(
        east=FakeHost(models={m: False for m in models}),
        west=FakeHost(models={m: True for m in models}, trainer="running", pid=next(_pids)),
    )
