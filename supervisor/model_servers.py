"""One model server as the supervisor sees it: its sleep state, sleep/wake, and its process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from supervisor.clock import Clock
from supervisor.config import ModelConfig
from supervisor.engines.adapter import EngineAdapter
from supervisor.engines.control import (
    ControlError,
    DrainResult,
    VllmControl,
    base_url,
    describe_http_error,
    drain,
)
from supervisor.engines.launch import LaunchCommand
from supervisor.managed import STARTING, ManagedProcess
from supervisor.probe import engine_version
from supervisor.processes import AdoptedProcess
from supervisor.records import ServerRecord
from supervisor.secrets import SecretUnavailable

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 5.0
# A cold start (llama.cpp wake) loads weights from disk; large GGUF files take minutes.
COLD_START_TIMEOUT_S = 600.0
# The engine's version (`GET /version`) is read in the background, never inside a status call:
# once per server process (a restart may be an upgrade); again after VERSION_RECHECK_S for a
# server the supervisor did not start (it can be replaced under it, same port, no pid known);
# after VERSION_RETRY_S when a read got no version.
VERSION_RECHECK_S = 300.0
VERSION_RETRY_S = 30.0


@dataclass(frozen=True)
class SleepReading:
    """What a status read found: the flag (None = unknown) and, when unknown, why."""

    sleeping: bool | None
    error: str | None = None


class ModelServer:
    """Control one model server on 127.0.0.1:port, managed or not."""

    def __init__(
        self,
        config: ModelConfig,
        adapter: EngineAdapter,
        *,
        clock: Clock,
        launch: LaunchCommand | None = None,
        managed: ManagedProcess | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._environ = environ if environ is not None else {}
        self.adapter = adapter
        self.control = adapter.control
        self.launch = launch
        self.managed = managed
        self._clock = clock
        # One sleep or wake at a time per server: a second identical call waits and then finds
        # the work done, which is what makes the fan-out idempotent under concurrency.
        self.lock = asyncio.Lock()
        # What the supervisor last asked for; a restarted server is put back in that state.
        self.want_asleep: bool | None = None
        # For engines without a status endpoint: the state after the last successful call,
        # valid only for the process it was made on.
        self._remembered: tuple[bool, int | None] | None = None
        # Background re-sleeps; referenced so they are not garbage-collected mid-flight.
        self._tasks: set[asyncio.Task[None]] = set()
        # The sleep in flight (drain, then sleep): a second sleep call joins it.
        self._sleep_task: asyncio.Task[DrainResult | None] | None = None
        # When the drain of the sleep in flight must end at the latest (monotonic), as its
        # callers stated; None: only the config's drain budget bounds it.
        self._drain_until: float | None = None
        self.draining = False
        self.last_drain: DrainResult | None = None
        # The engine version last read, the process it was read from, and when (monotonic).
        self._version: str | None = None
        self._version_pid: int | None = None
        self._version_read_at: float | None = None
        self._version_task: asyncio.Task[None] | None = None
        # Run once a (re)started process answers its health check and is meant to be awake:
        # the host loads the model's wanted LoRA adapters again (a new process has none).
        self.after_start: Callable[[ModelServer], Awaitable[None]] | None = None

    def auth_headers(self) -> dict[str, str]:
        """The server's own API key as a bearer header (none configured: no header).

        Read at each use, so a rotated key file takes effect without a restart; raises
        SecretUnavailable naming only the reference.
        """
        ref = self.config.api_key
        if ref is None:
            return {}
        return {"Authorization": f"Bearer {ref.read(self._environ)}"}

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def port(self) -> int:
        return self.config.port

    @property
    def gpu_index(self) -> int:
        return self.config.gpu_index

    @property
    def serves_http(self) -> bool:
        return self.launch.serves_http if self.launch else True

    @property
    def mode(self) -> str:
        return self.control.capability.mode

    @property
    def busy(self) -> bool:
        """Whether a sleep or wake of this server is in flight (a swap must wait for it)."""
        sleeping = self._sleep_task is not None and not self._sleep_task.done()
        return self.lock.locked() or sleeping

    async def read_sleeping(self, http: httpx.AsyncClient) -> SleepReading:
        """Read the sleep flag; unknown (None) whenever the answer is not certain."""
        if not self.serves_http:
            return SleepReading(None, "worker rank: this node serves no HTTP")
        if self.mode == "stop":
            return await self._read_stopped_state(http)
        if self.managed is not None and not self.managed.running:
            return SleepReading(None, f"server is {self.managed.state}")
        if self.control.capability.status is None:
            return await self._read_remembered(http)
        try:
            return SleepReading(await self.control.is_sleeping(http, self.port))
        except ControlError as exc:
            return SleepReading(None, str(exc))

    def begin_sleep(
        self,
        http: httpx.AsyncClient,
        drain_budget_s: float = 0.0,
        drain_until: float | None = None,
    ) -> asyncio.Task[DrainResult | None]:
        """Start putting the server on standby, or join the sleep already in flight.

        The work runs in a task of its own, so a caller that stops waiting (an HTTP call past
        its cap) leaves it running, and the next call finds and joins it. `drain_until` (a
        monotonic time) ends the drain by then whatever is left of `drain_budget_s`: a caller
        that stated how long it waits. A caller joining a sleep in flight may bring its drain's
        end forward, never push it back (as a later training stop's deadline).
        """
        if self._sleep_task is None or self._sleep_task.done():
            self._drain_until = drain_until
            self._sleep_task = asyncio.get_running_loop().create_task(
                self._sleep(http, drain_budget_s)
            )
        elif drain_until is not None:
            current = self._drain_until
            self._drain_until = drain_until if current is None else min(current, drain_until)
        return self._sleep_task

    async def sleep(self, http: httpx.AsyncClient, drain_budget_s: float = 0.0) -> None:
        """Put the server on standby; raise ControlError with the reason on failure."""
        await asyncio.shield(self.begin_sleep(http, drain_budget_s))

    async def _sleep(self, http: httpx.AsyncClient, drain_budget_s: float) -> DrainResult | None:
        async with self.lock:
            self._want(True)
            if self.mode == "stop":
                if self.managed is None:
                    raise ControlError("this engine cannot sleep and the server is not managed")
                await self.managed.stop()
                return None
            self._require_running()
            result = None
            if drain_budget_s > 0 and isinstance(self.control, VllmControl):
                result = await self._drain_then_sleep(http, drain_budget_s)
            else:
                await self.control.sleep(http, self.port)
            self._remember(True)
            return result

    async def _drain_then_sleep(self, http: httpx.AsyncClient, budget_s: float) -> DrainResult:
        """Let running requests finish (within the budget), then sleep, aborting stragglers."""
        assert isinstance(self.control, VllmControl)
        self.draining = True
        by_budget = self._clock.monotonic() + budget_s

        def until() -> float:
            stated = self._drain_until
            return by_budget if stated is None else min(by_budget, stated)

        try:
            result = await drain(http, self.port, until, self._clock)
            if not result.supported:
                await self.control.sleep_after_running(http, self.port)
            else:
                if not result.drained:
                    log.warning(
                        "%s: %d request(s) still running after %.1fs of draining (budget "
                        "%.0fs, or what the caller stated); the sleep aborts them",
                        self.name,
                        result.running,
                        result.waited_ms / 1000,
                        budget_s,
                    )
                await self.control.sleep(http, self.port)
        finally:
            self.draining = False
        self.last_drain = result
        return result

    async def wake(self, http: httpx.AsyncClient) -> None:
        """Bring the server back to serving; raise ControlError with the reason on failure."""
        async with self.lock:
            self._want(False)
            if self.mode == "stop":
                if self.managed is None:
                    raise ControlError("this engine cannot wake and the server is not managed")
                self.managed.start()
                await self._wait_healthy(http, COLD_START_TIMEOUT_S)
                return
            self._require_running()
            await self.control.wake(http, self.port)
            self._remember(False)

    def adopt(self, proc: AdoptedProcess, record: ServerRecord) -> None:
        """Take over the server a previous supervisor started, with what it knew of it."""
        assert self.managed is not None
        self.want_asleep = record.want_asleep
        if record.sleeping is not None:
            self._remembered = (record.sleeping, proc.pid)
        self.managed.adopt(proc, record)

    def on_process_started(self, http_getter: Any) -> None:
        """Put a restarted server back to sleep if that is what was last asked for; else, once
        healthy, give it what `after_start` adds (its adapters)."""
        if self.want_asleep and self.mode != "stop":
            task = asyncio.get_running_loop().create_task(self._resleep(http_getter()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.schedule_after_start(http_getter)

    def schedule_after_start(self, http_getter: Any) -> None:
        if self.after_start is None:
            return
        task = asyncio.get_running_loop().create_task(self._after_start(http_getter()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after_start(self, http: httpx.AsyncClient) -> None:
        try:
            await self._wait_healthy(http, COLD_START_TIMEOUT_S)
        except ControlError as exc:
            log.error("%s: not healthy after its start, adapters not loaded: %s", self.name, exc)
            return
        if self.after_start is not None and not self.want_asleep:
            await self.after_start(self)

    # LoRA adapters (supervisor/engines/lora.py); ControlError when the engine refuses.

    async def load_adapter(self, http: httpx.AsyncClient, name: str, path: str) -> None:
        assert self.adapter.lora is not None
        await self.adapter.lora.load(http, self.port, name, path, self.auth_headers())

    async def unload_adapter(self, http: httpx.AsyncClient, name: str) -> None:
        assert self.adapter.lora is not None
        await self.adapter.lora.unload(http, self.port, name, self.auth_headers())

    async def loaded_adapters(self, http: httpx.AsyncClient) -> list[str]:
        assert self.adapter.lora is not None
        return await self.adapter.lora.loaded(http, self.port, self.auth_headers())

    async def close(self) -> None:
        """Cancel background work (shutdown)."""
        if self._sleep_task is not None and not self._sleep_task.done():
            self._tasks.add(self._sleep_task)  # type: ignore[arg-type]
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def engine_version(self, http: httpx.AsyncClient, *, answered: bool = True) -> str | None:
        """Return the version the running server's engine reported, or None when not known yet.

        Never waits: a read that is due (see VERSION_RECHECK_S) starts in the background and
        its answer shows in a later status. `answered`: whether the server answered this
        status's sleep read; a server still starting is not asked (its refusal would read as
        "no version" until the retry). A version read from an earlier process is not this one's.
        """
        if not self.serves_http or (self.managed is not None and not self.managed.running):
            return None
        pid = self.managed.pid if self.managed is not None else None
        valid = self._version_read_at is not None and self._version_pid == pid
        if valid:
            assert self._version_read_at is not None
            age = self._clock.monotonic() - self._version_read_at
            if self._version is None:
                due = age >= VERSION_RETRY_S
            else:
                due = self.managed is None and age >= VERSION_RECHECK_S
        else:
            due = True
        if due and answered and (self._version_task is None or self._version_task.done()):
            task = asyncio.get_running_loop().create_task(self._read_version(http, pid))
            self._version_task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return self._version if valid else None

    def note_engine_version(self, version: str | None, pid: int | None) -> None:
        """Remember what the engine of process `pid` said its version is (None: it did not)."""
        self._version, self._version_pid = version, pid
        self._version_read_at = self._clock.monotonic()

    async def _read_version(self, http: httpx.AsyncClient, pid: int | None) -> None:
        try:
            headers = self.auth_headers()
        except SecretUnavailable:
            headers = None  # the version is public on vLLM; an unreadable key is reported elsewhere
        self.note_engine_version(await engine_version(http, port=self.port, headers=headers), pid)

    def describe(self, reading: SleepReading, version: str | None = None) -> dict[str, Any]:
        """Render the status entry; `sleeping` first, as the original wire format has it."""
        managed = self.managed.describe() if self.managed else None
        running = self.managed.running if self.managed else None
        return {
            "name": self.name,
            "port": self.port,
            "sleeping": reading.sleeping,
            "engine": self.config.engine,
            # Reported only for a process the supervisor started (or one it adopted, with the
            # fingerprint recorded at its start, so drift shows); anything else is unknown,
            # which the control plane must never read as a match.
            "fingerprint": self.managed.fingerprint if self.managed and running else None,
            # What the engine's `GET /version` said, read in the background (None: not yet).
            "engineVersion": version,
            "managed": self.managed is not None,
            "role": "leader" if self.serves_http else "worker",
            "standby": self.control.capability.describe(),
            "process": managed,
            "draining": self.draining,
            "error": reading.error,
        }

    def _require_running(self) -> None:
        if self.managed is not None and not self.managed.running:
            raise ControlError(f"server is not running (state {self.managed.state})")

    def _want(self, asleep: bool) -> None:
        self.want_asleep = asleep
        if self.managed is not None:
            self.managed.note_want_asleep(asleep)

    def _remember(self, asleep: bool) -> None:
        self._remembered = (asleep, self.managed.pid if self.managed else None)
        if self.managed is not None:
            self.managed.note_sleeping(asleep)

    async def _read_remembered(self, http: httpx.AsyncClient) -> SleepReading:
        healthy, error = await self._healthy(http)
        if not healthy:
            return SleepReading(None, error)
        pid = self.managed.pid if self.managed else None
        if self._remembered is not None and self._remembered[1] == pid:
            return SleepReading(self._remembered[0])
        if self.managed is not None and not self.managed.adopted:
            # A process the supervisor just started has had no release call: it is awake.
            return SleepReading(False)
        if self.managed is not None:
            return SleepReading(
                None,
                "adopted server whose engine has no status endpoint: unknown until the "
                "next sleep or wake",
            )
        return SleepReading(None, "engine has no status endpoint and no call was made yet")

    async def _read_stopped_state(self, http: httpx.AsyncClient) -> SleepReading:
        assert self.managed is not None  # config refuses unmanaged stop-mode engines
        if not self.managed.running:
            if self.want_asleep:
                return SleepReading(True)
            return SleepReading(None, f"server is {self.managed.state}")
        healthy, error = await self._healthy(http)
        return SleepReading(False) if healthy else SleepReading(None, error)

    async def _healthy(self, http: httpx.AsyncClient) -> tuple[bool, str | None]:
        try:
            response = await http.get(
                base_url(self.port) + self.adapter.health_path, timeout=HEALTH_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            return False, describe_http_error(exc)
        if response.status_code != 200:
            return False, f"health returned HTTP {response.status_code}"
        return True, None

    async def wait_healthy(self, http: httpx.AsyncClient, timeout_s: float) -> None:
        """Wait until the process started here runs and answers its health check; raise
        ControlError when it cannot. Before the spawn, whatever answers on the port is not it
        (a swap's old server still stopping), so health counts only once it runs."""
        deadline = self._clock.monotonic() + timeout_s
        while self.managed is not None and self.managed.state == STARTING:
            if self._clock.monotonic() >= deadline:
                raise ControlError(f"the server did not start within {timeout_s:.0f}s")
            await self._clock.sleep(0.05)
        await self._wait_healthy(http, max(0.0, deadline - self._clock.monotonic()))

    async def _wait_healthy(self, http: httpx.AsyncClient, timeout_s: float) -> None:
        deadline = self._clock.monotonic() + timeout_s
        last = "not started"
        while self._clock.monotonic() < deadline:
            if self.managed is not None and self.managed.state in ("backoff", "conflict"):
                raise ControlError(
                    f"cold start failed: {self.managed.last_error or self.managed.state}"
                )
            if self.managed is not None and self.managed.state == "stopped":
                raise ControlError("server was stopped while starting")
            healthy, error = await self._healthy(http)
            if healthy:
                return
            last = error or last
            await self._clock.sleep(0.25)
        raise ControlError(f"cold start did not become healthy within {timeout_s:.0f}s: {last}")

    async def _resleep(self, http: httpx.AsyncClient) -> None:
        try:
            await self._wait_healthy(http, COLD_START_TIMEOUT_S)
            async with self.lock:
                if self.want_asleep:
                    await self.control.sleep(http, self.port)
                    self._remember(True)
                    log.info("%s: restarted server put back to sleep", self.name)
        except ControlError as exc:
            log.error("%s: could not put the restarted server back to sleep: %s", self.name, exc)
