"""Managed model servers: start from a profile, restart with backoff when they die, stop cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from supervisor.clock import Clock, iso_utc
from supervisor.engines.launch import LOOPBACK, LaunchCommand
from supervisor.processes import ChildProcess, Spawner

log = logging.getLogger(__name__)

STOPPED = "stopped"
STARTING = "starting"
RUNNING = "running"
BACKOFF = "backoff"
CONFLICT = "conflict"


async def tcp_port_in_use(port: int, timeout: float = 0.5) -> bool:
    """Tell whether something already accepts connections on 127.0.0.1:port."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(LOOPBACK, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class ManagedProcess:
    """Keep one server process running while it is wanted.

    Restarts back off exponentially (a server that dies at start must not spin a CPU), and
    the backoff resets once a run has lasted `stable_after_s`. A port already taken by a process
    the supervisor did not start is never fought over: the server is reported in conflict and
    the port is re-checked with the same backoff.
    """

    def __init__(
        self,
        name: str,
        launch: LaunchCommand,
        port: int,
        *,
        spawner: Spawner,
        clock: Clock,
        port_in_use: Callable[[int], Awaitable[bool]] = tcp_port_in_use,
        on_running: Callable[[], None] | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_after_s: float = 60.0,
    ) -> None:
        self.name = name
        self.launch = launch
        self.port = port
        self._spawner = spawner
        self._clock = clock
        self._port_in_use = port_in_use
        self._on_running = on_running
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._stable_after = stable_after_s
        self.state = STOPPED
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.started_at: float | None = None
        self._proc: ChildProcess | None = None
        self._wanted = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self.state == RUNNING and self._proc is not None

    def start(self) -> None:
        """Begin keeping the server running (no-op when already doing so)."""
        self._wanted = True
        if self._task is None or self._task.done():
            # Set now, not when the task first runs: a caller waiting for health must not read
            # "stopped" and give up before the spawn has even begun.
            self.state = STARTING
            self._task = asyncio.create_task(self._supervise(), name=f"managed-{self.name}")

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop keeping it running: SIGTERM the group, SIGKILL after `grace_s`, wait for exit.

        Polls rather than awaiting one process: a stop can arrive while a spawn is still in
        flight, and the process that spawn produces must be stopped too.
        """
        self._wanted = False
        self._wake.set()
        deadline = self._clock.monotonic() + grace_s
        terminated: set[int] = set()
        killed = False
        last: ChildProcess | None = self._proc
        while self._task is not None and not self._task.done():
            proc = self._proc
            if proc is not None:
                last = proc
                if proc.pid not in terminated:
                    terminated.add(proc.pid)
                    log.info("%s: stopping server (pid %s)", self.name, proc.pid)
                    proc.signal_group(signal.SIGTERM)
                elif not killed and self._clock.monotonic() >= deadline:
                    log.warning("%s: server ignored SIGTERM for %.0fs; SIGKILL", self.name, grace_s)
                    proc.signal_group(signal.SIGKILL)
                    killed = True
            await asyncio.wait({self._task}, timeout=0.05)
        if last is not None:
            # Engine workers forked by the server may outlive it; they hold GPU memory.
            last.signal_group(signal.SIGKILL)
        self._task = None
        self.state = STOPPED

    def kill_now(self) -> None:
        self._wanted = False
        if self._proc is not None:
            self._proc.signal_group(signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "startedAt": iso_utc(self.started_at) if self.running else None,
            "restarts": self.restarts,
            "lastExitCode": self.last_exit_code,
            "lastError": self.last_error,
        }

    async def _supervise(self) -> None:
        backoff = self._backoff_initial
        while self._wanted:
            if await self._port_in_use(self.port):
                self.state = CONFLICT
                self.last_error = (
                    f"port {self.port} is already in use by a process the supervisor did not "
                    "start; not starting a second server"
                )
                log.error("%s: %s", self.name, self.last_error)
                await self._pause(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            self.state = STARTING
            try:
                proc = await self._spawner.spawn(self.launch.argv, env=self.launch.env)
            except (OSError, ValueError) as exc:
                self.state = BACKOFF
                self.last_error = f"spawn failed: {exc}"
                log.error("%s: %s; retrying in %.0fs", self.name, self.last_error, backoff)
                await self._pause(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            self._proc = proc
            self.state = RUNNING
            self.started_at = self._clock.wall()
            began = self._clock.monotonic()
            log.info("%s: server started (pid %s) %s", self.name, proc.pid, self.launch.describe())
            if self._on_running is not None:
                self._on_running()
            code = await proc.wait()
            self._proc = None
            self.last_exit_code = code
            if not self._wanted:
                break
            if self._clock.monotonic() - began >= self._stable_after:
                backoff = self._backoff_initial
            self.restarts += 1
            self.state = BACKOFF
            self.last_error = f"server exited with code {code}; restarting in {backoff:.0f}s"
            log.error("%s: %s", self.name, self.last_error)
            # Clean up whatever the dead leader left in its group before starting a new one.
            proc.signal_group(signal.SIGKILL)
            await self._pause(backoff)
            backoff = min(backoff * 2, self._backoff_max)
        self.state = STOPPED

    async def _pause(self, seconds: float) -> None:
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([sleeper, waker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
