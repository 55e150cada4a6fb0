"""The host: every slot, model server and trainer of this GPU machine, and what can be done.

This is the service layer behind the HTTP API. Routes parse, call one method here and render;
failures are raised as the domain exceptions below and mapped to HTTP in `api.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from common.strict_json import ConfigError
from common.wire.shape import FEATURES
from supervisor.adapters import AdapterRefused, AdapterStore, check_id
from supervisor.adoption import adopt_children
from supervisor.clock import Clock, SystemClock, iso_utc
from supervisor.config import (
    InferenceSlotConfig,
    ModelConfig,
    SupervisorConfig,
    servers_per_gpu,
)
from supervisor.engines.control import ControlError, drain_deadline
from supervisor.engines.launch import LaunchCommand, LaunchContext
from supervisor.engines.registry import EngineRegistry, default_registry
from supervisor.gpu.facts import GpuBackend, GpuQueryFailed, GpuUnavailable
from supervisor.gpu.plan_check import plan_mismatches
from supervisor.gpu.sim_state import ENV_VAR as SIM_STATE_ENV
from supervisor.managed import ManagedProcess, tcp_port_in_use
from supervisor.model_servers import ModelServer, SleepReading
from supervisor.probe import engine_version, probe_model
from supervisor.processes import AsyncioSpawner, Spawner
from supervisor.records import MAX_WANTED_ADAPTERS, AdapterLoads, StateDir, SwapRecord
from supervisor.secrets import SecretUnavailable
from supervisor.settings import AdapterLimits
from supervisor.swaps import (
    DEFAULT_START_TIMEOUT_S,
    FAILED,
    IN_PLACE,
    MODES,
    PROBE_MAX_TOKENS,
    PROBE_PROMPT,
    PROBE_TIMEOUT_S,
    PROBING,
    STARTING,
    STOPPING_OLD,
    SWITCHED,
    SWITCHING,
    SwapRefused,
    SwapState,
    swapped_config,
)
from supervisor.training import TrainingBusy, TrainingSlot

log = logging.getLogger(__name__)

# On its own SIGTERM the supervisor gives trainers at most this long, whatever their config says:
# the host is going away, and the 40 s hard exit must still leave time to kill them.
SHUTDOWN_TRAINING_GRACE_MS = 30_000
SHUTDOWN_SERVER_GRACE_S = 10.0
# A training stop whose SIGKILL is due within this answers once the trainer is gone (this
# long after the kill at most): a killed process exits in milliseconds.
STOP_ANSWER_WAIT_S = 0.5


class InvalidTarget(Exception):
    """The request names a GPU this host has no such slot on."""


class ShuttingDown(Exception):
    """The supervisor is exiting and refuses to start anything."""


class InsufficientGpuMemory(Exception):
    """A wake would not fit: free memory on a GPU is below what its sleeping servers restore.

    Caught before `/wake_up`, so a trainer that leaked memory shows up as this clear error
    rather than as an out-of-memory crash inside the model server.
    """

    def __init__(self, shortfalls: list[dict[str, Any]]) -> None:
        self.shortfalls = shortfalls
        super().__init__(
            "; ".join(
                f"GPU {g['gpuIndex']}: {g['freeMiB']} MiB free, waking "
                f"{', '.join(g['models'])} needs {g['neededMiB']} MiB "
                f"({g['usedMiB']} of {g['totalMiB']} MiB in use)"
                for g in shortfalls
            )
        )


class ModelFailures(Exception):
    """Some model servers failed a sleep or wake; one entry per failed model."""

    def __init__(self, action: str, failures: list[dict[str, Any]]) -> None:
        self.action = action
        self.failures = failures
        names = ", ".join(f"{f['model']} ({f['error']})" for f in failures)
        super().__init__(f"{action} failed for {len(failures)} model(s): {names}")


@dataclass
class HostDeps:
    """The host's I/O, injectable so tests can script every boundary."""

    gpu: GpuBackend
    spawner: Spawner = field(default_factory=AsyncioSpawner)
    clock: Clock = field(default_factory=SystemClock)
    registry: EngineRegistry = field(default_factory=default_registry)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    http_factory: Callable[[], httpx.AsyncClient] | None = None
    port_in_use: Callable[[int], Awaitable[bool]] = tcp_port_in_use
    # Where started processes are recorded for adoption after a crash; None: not recorded.
    state: StateDir | None = None
    # The adapter store's bounds (supervisor/adapters.py); it lives in the state dir.
    adapters: AdapterLimits = field(default_factory=AdapterLimits)


def default_http_client() -> httpx.AsyncClient:
    # trust_env=False: an HTTP(S)_PROXY in the environment must never capture loopback calls.
    return httpx.AsyncClient(trust_env=False, timeout=10.0)


class Host:
    """Own this machine's model servers and trainers."""

    def __init__(self, config: SupervisorConfig, deps: HostDeps) -> None:
        self.config = config
        self.deps = deps
        self.clock = deps.clock
        self.gpu = deps.gpu
        self.shutting_down = False
        self._http: httpx.AsyncClient | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self.host_env = self._host_env()
        # The config's own port and launch fingerprint per managed model: a recorded swap holds
        # only while the config's entry is still the one it replaced.
        self._base: dict[str, tuple[int, str | None]] = {}
        self.models = self._build_models()
        # Swaps (supervisor/swaps.py): the last one's progress per model, the task of each in
        # flight, the new servers not switched to yet, and old servers still being stopped.
        self._swaps: dict[str, SwapState] = {}
        self._swap_tasks: dict[str, asyncio.Task[None]] = {}
        self._candidates: dict[str, ModelServer] = {}
        self._retiring: set[ModelServer] = set()
        self._swap_lock = asyncio.Lock()
        # Differences between the plan this config came from and the real GPUs (start-up).
        self.plan_mismatches: list[dict[str, Any]] = []
        self.training = [
            TrainingSlot(
                slot,
                spawner=deps.spawner,
                clock=deps.clock,
                environ=deps.environ,
                host_env=self.host_env,
                records=deps.state,
            )
            for slot in config.training_slots
        ]
        self._orphans: set[asyncio.Task[None]] = set()
        # LoRA adapters (docs/adapters.md): the store, the adapters each model's server should
        # have loaded (engine name -> store id; kept in the state dir), and what each engine
        # last said it has loaded (its /v1/models), for the status report.
        state_path = deps.state.path if deps.state is not None else None
        self.adapter_store = (
            AdapterStore(
                state_path / "adapters",
                checkpoint_dirs=[s.checkpoint_dir for s in config.training_slots],
                max_store_bytes=deps.adapters.store_bytes,
                max_adapter_bytes=deps.adapters.max_bytes,
                now=lambda: iso_utc(self.clock.wall()),
            )
            if state_path is not None
            else None
        )
        self._adapter_loads = AdapterLoads(state_path)
        self._wanted: dict[str, dict[str, str]] = self._adapter_loads.load()
        self._engine_adapters: dict[str, list[str]] = {}
        self._adapter_locks: dict[str, asyncio.Lock] = {}
        self._transfers: set[tuple[str, str]] = set()
        for model in self.models:
            model.after_start = self._reload_adapters

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = (self.deps.http_factory or default_http_client)()
        return self._http

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Adopt what a previous supervisor left running, then start every managed server."""
        await self.verify_plan()
        if self.deps.state is not None:
            # Before adoption: a swapped model's process runs the recorded profile on its port.
            self._apply_recorded_swaps(self.deps.state)
            # Before spawning anything: an adopted server's port must not read as a conflict.
            self._orphans.update(adopt_children(self, self.deps.state))
        for model in self.models:
            if model.managed is not None:
                if model.managed.adopted and self._wanted.get(model.name):
                    # An adopted server kept what it had loaded; loading again is idempotent
                    # and covers one that restarted while no supervisor watched it.
                    model.schedule_after_start(lambda: self.http)
                model.managed.start()

    def begin_shutdown(self) -> None:
        """Refuse new work and start stopping trainers and managed servers (idempotent)."""
        if self._shutdown_task is not None:
            return
        self.shutting_down = True
        log.warning("supervisor shutting down: stopping trainers and managed servers")
        self._shutdown_task = asyncio.get_running_loop().create_task(self._stop_children())

    async def shutdown(self) -> None:
        """Stop everything this host started and release its clients."""
        self.begin_shutdown()
        assert self._shutdown_task is not None
        await self._shutdown_task
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        close = getattr(self.gpu, "close", None)
        if close is not None:
            close()

    def kill_now(self) -> None:
        """SIGKILL every child group at once; the hard-exit path when a graceful stop overran."""
        for slot in self.training:
            slot.kill_now()
        for model in self._every_server():
            if model.managed is not None:
                model.managed.kill_now()

    def _every_server(self) -> list[ModelServer]:
        """The served models, the new servers of swaps in flight and old ones being stopped."""
        return [*self.models, *self._candidates.values(), *self._retiring]

    async def _stop_children(self) -> None:
        # A swap in flight stops where it is; its new server is stopped below with the rest.
        for task in self._swap_tasks.values():
            task.cancel()
        await asyncio.gather(*self._swap_tasks.values(), return_exceptions=True)
        for slot in self.training:
            slot.stop(min(slot.config.grace_ms, SHUTDOWN_TRAINING_GRACE_MS))
        waits: list[Awaitable[Any]] = [
            slot.wait_idle(SHUTDOWN_TRAINING_GRACE_MS / 1000 + 5) for slot in self.training
        ]
        servers = self._every_server()
        waits += [m.managed.stop(SHUTDOWN_SERVER_GRACE_S) for m in servers if m.managed is not None]
        waits += [m.close() for m in servers]
        waits += list(self._orphans)
        results = await asyncio.gather(*waits, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.error("error while stopping a child: %r", result)
        log.info("all trainers and managed servers stopped")

    async def verify_plan(self) -> list[dict[str, Any]]:
        """Compare the GPUs the plan assumed with the real ones; remember every mismatch.

        A mismatch does not stop the host (it may still serve), but it is reported in
        `/v1/status` so the control plane can show that its plan does not hold here.
        """
        planned = self.config.plan.gpus
        if not planned:
            self.plan_mismatches = []
            return []
        try:
            facts = {g.index: g for g in await self.gpu.read()}
        except (GpuUnavailable, GpuQueryFailed) as exc:
            self.plan_mismatches = [
                {"code": "gpu_facts_unavailable", "message": f"cannot verify the plan: {exc}"}
            ]
            return self.plan_mismatches
        self.plan_mismatches = plan_mismatches(planned, facts)
        for m in self.plan_mismatches:
            log.warning("plan mismatch: %s", m["message"])
        return self.plan_mismatches

    # -- status ------------------------------------------------------------------------------

    async def status(self, models: Sequence[str] | None = None) -> dict[str, Any]:
        """Describe every slot (only the named models when `models` is given).

        `ready` keeps the original contract's meaning: every selected model is awake, and there
        is at least one. `stateKnown` is ours: every selected model's sleep state is known.
        """
        readings = await self._read_all()
        selected = None if models is None else set(models)
        slots: list[dict[str, Any]] = []
        for slot in self.config.slots:
            if isinstance(slot, InferenceSlotConfig):
                described = [
                    self._describe_model(m, readings[m.name])
                    for m in self.models
                    if m.gpu_index == slot.gpu_index and (selected is None or m.name in selected)
                ]
                slots.append({"gpuIndex": slot.gpu_index, "kind": "inference", "models": described})
            else:
                trainer = self._training_slot(slot.gpu_index)
                slots.append(
                    {"gpuIndex": slot.gpu_index, "kind": "training", "training": trainer.describe()}
                )
        ready, known, reasons = self._readiness(readings, selected)
        body: dict[str, Any] = {
            "slots": slots,
            "ready": ready,
            "stateKnown": known,
            "notReady": reasons,
            "host": self.config.host,
            "shuttingDown": self.shutting_down,
            "gpuBackend": self.gpu.name,
            "features": list(FEATURES),
        }
        if self.plan_mismatches:
            # Additive and omitted when empty: readers that do not know it see no change.
            body["planMismatches"] = list(self.plan_mismatches)
        return body

    def _describe_model(self, model: ModelServer, reading: SleepReading) -> dict[str, Any]:
        version = model.engine_version(self.http, answered=reading.sleeping is not None)
        entry = model.describe(reading, version)
        swap = self._swaps.get(model.name)
        if swap is not None:
            # Additive: readers that do not know it (the original) see no change.
            entry["swap"] = swap.describe()
        wanted = self._wanted.get(model.name)
        loaded = self._engine_adapters.get(model.name)
        if wanted or loaded:
            # Cheap: what is wanted, and what the engine said at its last load, unload, wake,
            # restart or adapter listing; no engine call and no file read here.
            entry["adapters"] = {"wanted": sorted(wanted or ()), "loaded": list(loaded or ())}
        return entry

    async def readiness(self) -> tuple[bool, bool, list[str]]:
        """Return (every model awake, every sleep state known, the reasons for not ready)."""
        return self._readiness(await self._read_all(), None)

    def _readiness(
        self, readings: Mapping[str, SleepReading], selected: set[str] | None
    ) -> tuple[bool, bool, list[str]]:
        reasons = ["shutting down"] if self.shutting_down else []
        known = True
        awake = 0
        served = [
            m for m in self.models if m.serves_http and (selected is None or m.name in selected)
        ]
        for model in served:
            reading = readings[model.name]
            if reading.sleeping is None:
                known = False
                reasons.append(f"{model.name}: {reading.error or 'sleep state unknown'}")
            elif reading.sleeping:
                reasons.append(f"{model.name}: asleep")
            else:
                awake += 1
        if selected is not None:
            reasons += [
                f"{n}: not served on this host" for n in sorted(selected - {m.name for m in served})
            ]
        if not served:
            reasons.append("no model is served on this host")
        ready = not reasons
        return ready, known and not self.shutting_down, reasons

    async def _read_all(self) -> dict[str, SleepReading]:
        http = self.http
        readings = await asyncio.gather(*(m.read_sleeping(http) for m in self.models))
        return {m.name: r for m, r in zip(self.models, readings, strict=True)}

    # -- sleep and wake ----------------------------------------------------------------------

    async def sleep(
        self,
        gpu_index: int | None,
        wait_s: float | None = None,
        budget_s: float | None = None,
        drain_bound_s: float | None = None,
    ) -> dict[str, Any]:
        """Drain, then sleep every targeted model server; a call while one runs joins it.

        With `wait_s`, answer after at most that long: `status: draining` when the sleep is
        still in flight (it goes on; a later call joins it). Without it, as in the original
        contract, answer when every server is asleep. With `budget_s` (how long the caller
        waits for the sleep, all told) the drain ends early enough for the sleep to finish
        within it (`drain_deadline`). With `drain_bound_s` the drain ends that long after this
        call at the latest, and the sleep aborts what still runs (the caller moves it on).
        """
        targets = self._targets(gpu_index)
        http = self.http
        drain_s = self.config.drain_budget_ms / 1000
        now = self.clock.monotonic()
        ends = []
        if budget_s is not None:
            ends.append(drain_deadline(now, budget_s))
        if drain_bound_s is not None:
            ends.append(now + drain_bound_s)
            log.info("sleep: the caller bounds the drain at %d ms", int(drain_bound_s * 1000))
        until = min(ends) if ends else None
        tasks = {m.name: m.begin_sleep(http, drain_s, until) for m in targets}
        if wait_s is not None:
            _, pending = await asyncio.wait(list(tasks.values()), timeout=wait_s)
            if pending:
                return {
                    "status": "draining",
                    "ok": True,
                    "action": "sleep",
                    "models": [
                        {
                            "name": m.name,
                            "gpuIndex": m.gpu_index,
                            "sleeping": tasks[m.name].done() and m.want_asleep is True,
                            "draining": m.draining,
                        }
                        for m in targets
                    ],
                }
        return await self._fan_out("sleep", gpu_index, sleeps=tasks)

    async def wake(self, gpu_index: int | None) -> dict[str, Any]:
        targets = self._targets(gpu_index)
        await self._check_room_to_wake(targets)
        result = await self._fan_out("wake", gpu_index)
        # Before answering: the control plane probes every adapter right after the wake.
        await asyncio.gather(
            *(self._reload_adapters(m) for m in targets if self._wanted.get(m.name))
        )
        return result

    async def _check_room_to_wake(self, targets: list[ModelServer]) -> None:
        """Refuse a wake whose sleeping servers would not fit in the GPUs' free memory.

        Only servers whose config says what they restore (`memoryMiB`, from the plan) count;
        a server already awake restores nothing. Reading the GPUs may fail (501/502): a wake
        is a control-path action, so that fails it rather than guessing.
        """
        sized = [m for m in targets if m.config.wake_mib]
        if not sized:
            return
        readings = await asyncio.gather(*(m.read_sleeping(self.http) for m in sized))
        needed: dict[int, list[ModelServer]] = {}
        for model, reading in zip(sized, readings, strict=True):
            if reading.sleeping is not False:  # asleep, or unknown: assume it must wake
                for index in model.config.gpu_indices:
                    needed.setdefault(index, []).append(model)
        if not needed:
            return
        facts = {g.index: g for g in await self.gpu.read()}
        shortfalls = []
        for index, models in sorted(needed.items()):
            gpu = facts.get(index)
            need = sum(m.config.wake_mib or 0 for m in models)
            if gpu is None:
                continue  # not a GPU this backend reports; the plan check names it
            free = gpu.total_mib - gpu.used_mib
            if free < need:
                shortfalls.append(
                    {
                        "gpuIndex": index,
                        "freeMiB": free,
                        "neededMiB": need,
                        "usedMiB": gpu.used_mib,
                        "totalMiB": gpu.total_mib,
                        "models": [m.name for m in models],
                    }
                )
        if shortfalls:
            error = InsufficientGpuMemory(shortfalls)
            log.error("wake refused: %s", error)
            raise error

    async def _fan_out(
        self,
        action: str,
        gpu_index: int | None,
        sleeps: Mapping[str, asyncio.Task[Any]] | None = None,
    ) -> dict[str, Any]:
        targets = self._targets(gpu_index)
        http = self.http

        async def one(model: ModelServer) -> dict[str, Any] | None:
            try:
                if sleeps is not None:
                    # The sleep (and its drain) started or joined above; shielded, so a caller
                    # that goes away leaves it running.
                    await asyncio.shield(sleeps[model.name])
                else:
                    await model.wake(http)
            except ControlError as exc:
                return {"model": model.name, "gpuIndex": model.gpu_index, "error": str(exc)}
            return None

        # Concurrently: a failover waits for the slowest wake, not the sum of all of them.
        results = await asyncio.gather(*(one(m) for m in targets))
        failures = [r for r in results if r is not None]
        if failures:
            log.error("%s failed: %s", action, failures)
            raise ModelFailures(action, failures)
        asleep = action == "sleep"
        log.info("%s done for %s", action, ", ".join(m.name for m in targets))
        return {
            "status": "ok",
            "ok": True,
            "action": action,
            "models": [
                {
                    "name": m.name,
                    "gpuIndex": m.gpu_index,
                    "sleeping": asleep,
                    "drainedMs": m.last_drain.waited_ms if asleep and m.last_drain else None,
                }
                for m in targets
            ],
        }

    def _targets(self, gpu_index: int | None) -> list[ModelServer]:
        served = [m for m in self.models if m.serves_http]
        if gpu_index is None:
            return served
        if not any(s.gpu_index == gpu_index for s in self.config.inference_slots):
            raise InvalidTarget(f"no inference slot on GPU {gpu_index}")
        return [m for m in served if m.gpu_index == gpu_index]

    # -- swapping a model server to a new profile (supervisor/swaps.py) ------------------------

    async def begin_swap(
        self,
        *,
        model: str,
        profile: Any,
        mode: str,
        api_key: Any = None,
        start_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Check a swap, start it in a task of its own and say where the new server will listen.

        Everything that can be refused is refused here, before anything is touched: an unknown
        model (InvalidTarget), a bad profile or a server this host does not start (SwapRefused
        400), another swap or a sleep or wake on one of its GPUs, or no free port (409).
        """
        if self.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        if mode not in MODES:  # the route's schema says so too; a direct caller may not
            raise SwapRefused(400, "invalid_request", f"mode: must be one of {', '.join(MODES)}")
        old = self._model_named(model)
        if old.managed is None or old.config.profile is None:
            raise SwapRefused(
                400,
                "invalid_request",
                f"model: {model} is a server this supervisor does not start (no profile in its "
                "config); only a managed server can be swapped",
            )
        if not old.serves_http or old.config.profile.nodes > 1:
            raise SwapRefused(
                400,
                "invalid_request",
                f"model: {model} is a multi-node server; it cannot be swapped",
            )
        new_config = swapped_config(
            old.config, profile, api_key, registry=self.deps.registry, cwd=Path.cwd()
        )
        # One check-and-claim at a time: two calls must not both find the GPU free, or both
        # pick the same port.
        async with self._swap_lock:
            gpus = set(old.config.gpu_indices) | set(new_config.gpu_indices)
            self._refuse_if_busy(gpus)
            port = old.port if mode == IN_PLACE else await self._free_swap_port()
            self._refuse_if_busy(gpus)  # the port scan awaited: look again
            try:
                new = self._managed_server(
                    replace(new_config, port=port), servers_per_gpu(self.config)
                )
            except ConfigError as exc:
                raise SwapRefused(400, "invalid_request", "; ".join(exc.errors)) from exc
            state = SwapState(
                mode=mode,
                port=port,
                previous_port=old.port,
                started_at=self.clock.wall(),
                profile=profile,
            )
            self._swaps[model] = state
            self._candidates[model] = new
            timeout_s = start_timeout_s if start_timeout_s is not None else DEFAULT_START_TIMEOUT_S
            self._swap_tasks[model] = asyncio.get_running_loop().create_task(
                self._swap(old, new, state, timeout_s), name=f"swap-{model}"
            )
        assert new.launch is not None
        log.info(
            "%s: swapping (%s) from port %d to port %d: %s",
            model,
            mode,
            old.port,
            port,
            new.launch.describe(),
        )
        return {
            "status": "swapping",
            "model": model,
            "mode": mode,
            "port": port,
            "previousPort": old.port,
        }

    def _model_named(self, name: str) -> ModelServer:
        found = next((m for m in self.models if m.name == name), None)
        if found is None:
            raise InvalidTarget(f"no model {name} on this host")
        return found

    def _refuse_if_busy(self, gpus: set[int]) -> None:
        for name, state in self._swaps.items():
            if state.in_flight and gpus & set(self._model_named(name).config.gpu_indices):
                raise SwapRefused(
                    409, "swap_busy", f"a swap of {name} is in flight on GPU(s) {sorted(gpus)}"
                )
        for m in self.models:
            if m.busy and gpus & set(m.config.gpu_indices):
                raise SwapRefused(
                    409,
                    "swap_busy",
                    f"a sleep or wake of {m.name} is in flight on GPU(s) {sorted(gpus)}",
                )

    async def _free_swap_port(self) -> int:
        span = self.config.swap_ports
        if span is None:
            raise SwapRefused(
                400,
                "invalid_request",
                "mode: new-port needs swapPorts (a port range) in the supervisor config; "
                "configure one or swap in-place",
            )
        taken = {m.port for m in self._every_server()}
        for port in range(span[0], span[1] + 1):
            if port not in taken and not await self.deps.port_in_use(port):
                return port
        raise SwapRefused(
            409, "no_free_port", f"no free port in swapPorts {span[0]}-{span[1]} on this host"
        )

    async def _swap(
        self, old: ModelServer, new: ModelServer, state: SwapState, timeout_s: float
    ) -> None:
        try:
            await self._swap_steps(old, new, state, timeout_s)
        except Exception as exc:
            # A swap left "in flight" would refuse every later swap on its GPUs: end it.
            log.exception("%s: swap ended by an unexpected error", new.name)
            state.finish(FAILED, self.clock.wall(), f"{state.state}: internal error: {exc!r}")
            self._candidates.pop(new.name, None)
            if new.managed is not None and new not in self.models:
                await new.managed.stop(SHUTDOWN_SERVER_GRACE_S)
                if state.mode == IN_PLACE and old.managed is not None:
                    old.managed.start()  # its port is free again (a no-op if it runs)

    async def _swap_steps(
        self, old: ModelServer, new: ModelServer, state: SwapState, timeout_s: float
    ) -> None:
        """Start and probe the new server, then switch the model's name to it; see swaps.py."""
        assert old.managed is not None and new.managed is not None
        http = self.http
        try:
            if state.mode == IN_PLACE:
                state.state = STOPPING_OLD
                await old.managed.stop(SHUTDOWN_SERVER_GRACE_S)
            state.state = STARTING
            new.managed.start()
            await new.wait_healthy(http, timeout_s)
            state.state = PROBING
            result = await probe_model(
                http,
                name=new.name,
                port=new.port,
                prompt=PROBE_PROMPT,
                max_tokens=PROBE_MAX_TOKENS,
                timeout_s=PROBE_TIMEOUT_S,
                clock=self.clock,
                headers=new.auth_headers(),
            )
            if not result["ok"]:
                raise ControlError(f"probe failed: {result.get('error') or 'no answer'}")
        except (ControlError, SecretUnavailable) as exc:
            await self._fail_swap(old, new, state, f"{state.state}: {exc}", timeout_s)
            return
        state.state = SWITCHING
        async with old.lock:  # never in the middle of a sleep or wake of the old server
            self.models[self.models.index(old)] = new
            self._candidates.pop(new.name, None)
            self._record_swap(new, state)
            self._retiring.add(old)
        log.info("%s: now served on port %d; stopping the old server", new.name, new.port)
        await old.managed.stop(SHUTDOWN_SERVER_GRACE_S)
        await old.close()
        # Only once stopped: a shutdown that cancels this swap midway stops it from `_retiring`.
        self._retiring.discard(old)
        state.finish(SWITCHED, self.clock.wall())
        log.info("%s: swap done (%s, port %d)", new.name, state.mode, new.port)

    async def _fail_swap(
        self, old: ModelServer, new: ModelServer, state: SwapState, reason: str, timeout_s: float
    ) -> None:
        assert old.managed is not None and new.managed is not None
        await new.managed.stop(SHUTDOWN_SERVER_GRACE_S)
        await new.close()
        self._candidates.pop(new.name, None)
        if state.mode == IN_PLACE:
            # Its port is free again: the old profile goes back (a sleep asked before is redone
            # by the usual restart path, `on_process_started`).
            old.managed.start()
            try:
                await old.wait_healthy(self.http, timeout_s)
                reason += "; the old server was started again from its old profile"
            except ControlError as exc:
                reason += f"; starting the old server again failed too: {exc}"
        else:
            reason += "; the old server kept serving"
        state.finish(FAILED, self.clock.wall(), reason)
        log.error("%s: swap failed: %s", new.name, reason)

    def _record_swap(self, new: ModelServer, state: SwapState) -> None:
        """Write (or, back on the config's own profile and port, delete) the swap's record."""
        records = self.deps.state
        if records is None:
            return
        assert new.launch is not None and new.config.profile is not None
        if self._base.get(new.name) == (new.port, new.launch.fingerprint):
            records.forget_swap(new.name)
            return
        key = new.config.api_key
        base_port, base_fingerprint = self._base[new.name]
        records.save(
            SwapRecord(
                name=new.name,
                port=new.port,
                mode=state.mode,
                profile=state.profile,
                api_key_env=key.env if key is not None else None,
                api_key_file=str(key.file) if key is not None and key.file else None,
                base_port=base_port,
                base_fingerprint=base_fingerprint,
                previous_port=state.previous_port,
                swapped_at=self.clock.wall(),
            )
        )

    def _apply_recorded_swaps(self, records: StateDir) -> None:
        """Build each model a previous supervisor swapped from its recorded profile and port.

        A record holds while the config's entry is the one it replaced; otherwise (the entry
        was edited, removed or no longer managed, or its port is now another model's) the
        config wins and the record is deleted.
        """
        for record in records.load().swaps:
            model = next((m for m in self.models if m.name == record.name), None)
            others = {m.port for m in self.models if m.name != record.name}
            if (
                model is None
                or model.managed is None
                or self._base.get(record.name) != (record.base_port, record.base_fingerprint)
                or record.port in others
            ):
                log.warning(
                    "%s: the config's entry changed since its swap; serving the config's profile",
                    record.name,
                )
                records.forget_swap(record.name)
                continue
            api_key = None
            if record.api_key_env is not None:
                api_key = {"env": record.api_key_env}
            elif record.api_key_file is not None:
                api_key = {"file": record.api_key_file}
            try:
                config = swapped_config(
                    model.config,
                    dict(record.profile),
                    api_key,
                    registry=self.deps.registry,
                    cwd=Path.cwd(),
                )
                server = self._managed_server(
                    replace(config, port=record.port), servers_per_gpu(self.config)
                )
            except (SwapRefused, ConfigError) as exc:
                log.error(
                    "%s: its swap record cannot be used (%s); serving the config's", model.name, exc
                )
                records.forget_swap(record.name)
                continue
            self.models[self.models.index(model)] = server
            self._swaps[model.name] = SwapState(
                mode=record.mode,
                port=record.port,
                previous_port=record.previous_port,
                started_at=record.swapped_at,
                state=SWITCHED,
                ended_at=record.swapped_at,
                recorded=True,
                profile=record.profile,
            )
            log.warning(
                "%s: serving the profile it was swapped to (port %d), not the config's",
                model.name,
                record.port,
            )

    # -- training ----------------------------------------------------------------------------

    async def training_start(self) -> list[dict[str, Any]]:
        """Start every training slot's trainer; running ones are left alone."""
        if self.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        results = await asyncio.gather(
            *(slot.start() for slot in self.training), return_exceptions=True
        )
        for result in results:
            if isinstance(result, TrainingBusy):
                # As the original supervisor does: a start during a stop is a no-op, and the
                # caller sees `stopping` in the answer and asks again once it is idle.
                log.info("training start ignored: %s", result)
            elif isinstance(result, BaseException):
                raise result
        return self.training_status()

    async def training_stop(self, grace_ms: int | None) -> list[dict[str, Any]]:
        """Stop every trainer; answer at once, except for trainers killed within
        STOP_ANSWER_WAIT_S (a failover's stop, grace 0): the answer waits, that long at most,
        for them to be gone, so that it lists them idle and the caller need not look again a
        retry later (a round trip and a retry on the failover's path)."""
        dying = []
        for slot in self.training:
            slot.stop(grace_ms)
            kill_in = slot.kill_in()
            if kill_in is not None and kill_in <= STOP_ANSWER_WAIT_S:
                dying.append(slot.wait_idle(kill_in + STOP_ANSWER_WAIT_S))
        if dying:
            await asyncio.gather(*dying)
        return self.training_status()

    def training_status(self) -> list[dict[str, Any]]:
        return [{"gpuIndex": s.gpu_index, **s.describe()} for s in self.training]

    def _training_slot(self, gpu_index: int) -> TrainingSlot:
        return next(s for s in self.training if s.gpu_index == gpu_index)

    # -- GPU and probes ----------------------------------------------------------------------

    async def gpu_memory(self) -> dict[str, Any]:
        gpus = await self.gpu.read()
        return {"gpus": [g.to_json() for g in gpus], "backend": self.gpu.name}

    async def probe(
        self,
        *,
        prompt: str,
        max_tokens: int,
        timeout_ms: int,
        models: Sequence[str] | None,
        seed: int | None = None,
        adapters: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """Probe every served model (or the named ones) concurrently.

        A named model this host does not serve fails its own result instead of the whole call:
        the caller judges each of its models, and one wrong name must not hide the others.
        `adapters` adds one probe per LoRA adapter of a model; with a `seed` every probe is
        golden (greedy, seeded) and each result carries its answer and the engine's version.
        """
        targets = [m for m in self.models if m.serves_http]
        missing: list[dict[str, Any]] = []
        if models is not None:
            known = {m.name for m in targets}
            missing = [
                {"model": n, "ok": False, "latencyMs": 0, "error": "not served on this host"}
                for n in dict.fromkeys(models)
                if n not in known
            ]
            targets = [m for m in targets if m.name in models]
        http = self.http
        wanted = adapters or {}

        async def one(m: ModelServer) -> list[dict[str, Any]]:
            try:
                headers = m.auth_headers()
            except SecretUnavailable as exc:
                failed = {"model": m.name, "ok": False, "latencyMs": 0, "error": f"api key: {exc}"}
                return [failed]
            calls = [
                probe_model(
                    http,
                    name=m.name,
                    port=m.port,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    timeout_s=timeout_ms / 1000,
                    clock=self.clock,
                    headers=headers,
                    adapter=adapter,
                    seed=seed,
                )
                for adapter in (None, *dict.fromkeys(wanted.get(m.name, ())))
            ]
            if seed is None:
                return list(await asyncio.gather(*calls))
            # The version read runs beside the probes, within their budget: it must never
            # lengthen the failover's probe step.
            version_call = engine_version(
                http, port=m.port, headers=headers, timeout_s=timeout_ms / 1000
            )
            probed, version = await asyncio.gather(asyncio.gather(*calls), version_call)
            if version is not None:
                m.note_engine_version(version, m.managed.pid if m.managed is not None else None)
            return [{**r, "engineVersion": version} for r in probed]

        per_model = await asyncio.gather(*(one(m) for m in targets))
        every = [*(r for rs in per_model for r in rs), *missing]
        return {"ok": bool(every) and all(r["ok"] for r in every), "results": every}

    # -- construction ------------------------------------------------------------------------

    def _host_env(self) -> dict[str, str]:
        # What every child (server or trainer) gets from the host beyond its own contract.
        if self.config.gpu.backend == "sim" and self.config.gpu.sim_state_file is not None:
            return {SIM_STATE_ENV: str(self.config.gpu.sim_state_file)}
        return {}

    def _with_api_key(self, model: ModelConfig, launch: LaunchCommand) -> LaunchCommand:
        """Give a managed vLLM its key the way vLLM reads one (`VLLM_API_KEY`), never on the
        command line, in the config or in the fingerprint; raise ConfigError if unreadable."""
        if model.api_key is None or model.engine != "vllm":
            return launch
        try:
            key = model.api_key.read(self.deps.environ)
        except SecretUnavailable as exc:
            raise ConfigError([f"{model.path}.apiKey: {exc}"]) from exc
        return replace(launch, env={**launch.env, "VLLM_API_KEY": key})

    def _build_models(self) -> list[ModelServer]:
        sharing = servers_per_gpu(self.config)
        out: list[ModelServer] = []
        for model in self.config.models:
            adapter = self.deps.registry.get(model.engine)
            if model.profile is None:
                out.append(ModelServer(model, adapter, clock=self.clock, environ=self.deps.environ))
                continue
            server = self._managed_server(model, sharing)
            assert server.launch is not None
            self._base[model.name] = (model.port, server.launch.fingerprint)
            out.append(server)
        return out

    def _managed_server(self, model: ModelConfig, sharing: Mapping[int, int]) -> ModelServer:
        """A managed server for `model` (which has a profile), not started; raise ConfigError
        when its API key cannot be read."""
        assert model.profile is not None
        adapter = self.deps.registry.get(model.engine)
        ctx = LaunchContext(
            port=model.port,
            environ=self.deps.environ,
            servers_sharing_gpu=max(sharing.get(i, 1) for i in model.profile.gpu_indices),
            host_env=self.host_env,
        )
        launch = self._with_api_key(model, adapter.build(model.profile, ctx))
        server = ModelServer(
            model, adapter, clock=self.clock, launch=launch, environ=self.deps.environ
        )
        server.after_start = self._reload_adapters
        server.managed = ManagedProcess(
            model.name,
            launch,
            model.port,
            spawner=self.deps.spawner,
            clock=self.clock,
            port_in_use=self.deps.port_in_use,
            on_running=functools.partial(server.on_process_started, lambda: self.http),
            records=self.deps.state,
        )
        return server

    # -- LoRA adapters (docs/adapters.md) ----------------------------------------------------

    def _store(self) -> AdapterStore:
        if self.adapter_store is None:
            raise AdapterRefused(503, "adapters_unavailable", "this supervisor has no state dir")
        return self.adapter_store

    def adapter_store_required(self) -> AdapterStore:
        return self._store()

    @contextlib.asynccontextmanager
    async def adapter_transfer(self, adapter_id: str, path: str) -> AsyncIterator[None]:
        """One PUT at a time per incoming file: a second one, while the first still appends,
        would check its offset against a size about to change (409 `transfer_busy`)."""
        key = (adapter_id, path)
        if key in self._transfers:
            raise AdapterRefused(
                409,
                "transfer_busy",
                f"{path} of adapter {adapter_id} is being written by another PUT",
            )
        self._transfers.add(key)
        try:
            yield
        finally:
            self._transfers.discard(key)

    async def adapters(self) -> dict[str, Any]:
        """The store (completed checkpoints imported first), and what each engine has loaded."""
        listing = await asyncio.to_thread(self._store().listing)
        loaded: list[dict[str, Any]] = []
        servers = [m for m in self.models if m.serves_http and m.adapter.lora is not None]
        truths = await asyncio.gather(*(self._read_engine_adapters(m) for m in servers))
        for model, names in zip(servers, truths, strict=True):
            wanted = self._wanted.get(model.name, {})
            loaded += [{"model": model.name, "name": n, "id": wanted.get(n)} for n in names]
        return {**listing, "loaded": loaded}

    def adapter_file(self, adapter_id: str, path: str) -> Path:
        return self._store().file_path(adapter_id, path)

    async def adapter_commit(self, adapter_id: str, digest: str) -> dict[str, Any]:
        stored = await asyncio.to_thread(self._store().commit, adapter_id, digest)
        return {"id": stored.id, "digest": stored.manifest.digest, "bytes": stored.manifest.bytes}

    async def adapter_delete(self, adapter_id: str) -> None:
        loaded = {i for wanted in self._wanted.values() for i in wanted.values()}
        await asyncio.to_thread(self._store().delete, adapter_id, loaded)

    def _lora_server(self, model_name: str) -> ModelServer:
        model = self._model_named(model_name)
        if model.adapter.lora is None:
            raise AdapterRefused(
                400,
                "lora_unsupported",
                f"model {model_name} runs on {model.config.engine}, which cannot load LoRA "
                "adapters at runtime",
            )
        if not model.serves_http:
            raise AdapterRefused(400, "invalid_request", f"model {model_name} serves no HTTP here")
        return model

    def _lock_for(self, model: str) -> asyncio.Lock:
        return self._adapter_locks.setdefault(model, asyncio.Lock())

    async def adapter_load(self, model_name: str, name: str, adapter_id: str) -> dict[str, Any]:
        """Remember `name` -> stored `id` for the model, and load it now unless its server
        sleeps (then at the wake, before the wake answers)."""
        if self.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        model = self._lora_server(model_name)
        check_id(adapter_id)
        directory = await asyncio.to_thread(self._store().directory, adapter_id)
        async with self._lock_for(model_name):
            wanted = dict(self._wanted.get(model_name, {}))
            if wanted.get(name, adapter_id) != adapter_id:
                raise AdapterRefused(
                    409,
                    "name_taken",
                    f"{name} is loaded on {model_name} from adapter {wanted[name]}; an engine "
                    "name always means the same weights: unload it first",
                )
            if name not in wanted and len(wanted) >= MAX_WANTED_ADAPTERS:
                raise AdapterRefused(
                    409, "too_many_adapters", f"{model_name} has {len(wanted)} adapters loaded"
                )
            wanted[name] = adapter_id
            reading = await model.read_sleeping(self.http)
            if reading.sleeping is not False:
                self._remember_wanted(model_name, wanted)
                pending = "wake" if reading.sleeping else "start"
                return {"model": model_name, "name": name, "loaded": False, "pending": pending}
            try:
                await model.load_adapter(self.http, name, str(directory))
            except (ControlError, SecretUnavailable) as exc:
                raise ModelFailures(
                    "adapter_load", [{"model": model_name, "error": str(exc)}]
                ) from exc
            self._remember_wanted(model_name, wanted)
            await self._read_engine_adapters(model)
        return {"model": model_name, "name": name, "loaded": True}

    async def adapter_unload(self, model_name: str, name: str) -> dict[str, Any]:
        """Forget `name` for the model and unload it from its server when it runs."""
        model = self._lora_server(model_name)
        async with self._lock_for(model_name):
            wanted = dict(self._wanted.get(model_name, {}))
            wanted.pop(name, None)
            self._remember_wanted(model_name, wanted)
            if model.managed is None or model.managed.running:
                try:
                    await model.unload_adapter(self.http, name)
                except (ControlError, SecretUnavailable) as exc:
                    raise ModelFailures(
                        "adapter_unload", [{"model": model_name, "error": str(exc)}]
                    ) from exc
                await self._read_engine_adapters(model)
        return {"model": model_name, "name": name, "loaded": False}

    def _remember_wanted(self, model: str, wanted: dict[str, str]) -> None:
        if wanted:
            self._wanted[model] = wanted
        else:
            self._wanted.pop(model, None)
        self._adapter_loads.save(model, wanted)

    async def _reload_adapters(self, model: ModelServer) -> None:
        """Load every wanted adapter on the model's (woken or restarted) server; failures are
        logged, and the status report's `adapters` shows what the engine really holds."""
        wanted = dict(self._wanted.get(model.name, {}))
        if not wanted or model.adapter.lora is None or self.adapter_store is None:
            return
        store = self.adapter_store
        async with self._lock_for(model.name):
            for name, adapter_id in wanted.items():
                try:
                    directory = await asyncio.to_thread(store.directory, adapter_id)
                    await model.load_adapter(self.http, name, str(directory))
                except (AdapterRefused, ControlError, SecretUnavailable) as exc:
                    log.error("%s: could not load adapter %s again: %s", model.name, name, exc)
            await self._read_engine_adapters(model)
        log.info("%s: adapters loaded again: %s", model.name, ", ".join(sorted(wanted)))

    async def _read_engine_adapters(self, model: ModelServer) -> list[str]:
        """What the engine lists (its /v1/models); remembered for the status report. Empty
        when it cannot say (asleep, stopped, unreachable)."""
        names: list[str] = []
        if model.managed is None or model.managed.running:
            try:
                names = await model.loaded_adapters(self.http)
            except (ControlError, SecretUnavailable) as exc:
                log.debug("%s: adapters unknown: %s", model.name, exc)
        self._engine_adapters[model.name] = names
        return names
