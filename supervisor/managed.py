"""Managed model servers: start from a profile, restart with backoff when they die, stop cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from supervisor.clock import Clock, iso_utc
from supervisor.engines.launch import LOOPBACK, LaunchCommand
from supervisor.processes import AdoptedProcess, ChildProcess, Spawner
from supervisor.records import ProcessStamp, ServerRecord, StateDir

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

    With a state directory, every process it starts is recorded there, so that a supervisor
    restarted after a crash can `adopt` it instead of finding its port taken.
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
        records: StateDir | None = None,
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
        self._records = records
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._stable_after = stable_after_s
        self.state = STOPPED
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.started_at: float | None = None
        self._proc: ChildProcess | None = None
        # The profile fingerprint of the process now running: the launch's for one started
        # here, the recorded one for an adopted process (which may predate a profile change).
        self.fingerprint: str | None = None
        self.adopted = False
        self._adopt_next: tuple[AdoptedProcess, ServerRecord] | None = None
        # The record of the process now running (None between processes).
        self._record: ServerRecord | None = None
        # What was last asked of the server; it outlives one process, so a restart keeps it.
        self._want_asleep: bool | None = None
        self._wanted = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self.state == RUNNING and self._proc is not None

    def adopt(self, proc: AdoptedProcess, record: ServerRecord) -> None:
        """Take over a server a previous supervisor started; call before `start`."""
        self._adopt_next = (proc, record)

    def note_want_asleep(self, want_asleep: bool | None) -> None:
        """Persist what was last asked of the server; a restarted supervisor honours it too."""
        self._want_asleep = want_asleep
        if self._record is not None:
            self._update_record(replace(self._record, want_asleep=want_asleep))

    def note_sleeping(self, sleeping: bool) -> None:
        """Persist the sleep state the running server last confirmed."""
        if self._record is not None:
            self._update_record(replace(self._record, sleeping=sleeping))

    def _update_record(self, record: ServerRecord) -> None:
        if record != self._record:
            self._record = record
            if self._records is not None:
                self._records.save(record)

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
            "adopted": self.adopted if self.running else False,
            "lastExitCode": self.last_exit_code,
            "lastError": self.last_error,
        }

    async def _supervise(self) -> None:
        backoff = self._backoff_initial
        while self._wanted:
            proc: ChildProcess
            if self._adopt_next is not None:
                adopted, record = self._adopt_next
                self._adopt_next = None
                self._begin_run(adopted, record, adopted=True)
                proc = adopted
            else:
                spawned = await self._spawn(backoff)
                if spawned is None:
                    backoff = min(backoff * 2, self._backoff_max)
                    continue
                proc = spawned
            began = self._clock.monotonic()
            if self._on_running is not None and not self.adopted:
                self._on_running()
            code = await proc.wait()
            self._end_run()
            self.last_exit_code = code
            if not self._wanted:
                break
            if self._clock.monotonic() - began >= self._stable_after:
                backoff = self._backoff_initial
            self.restarts += 1
            self.state = BACKOFF
            status = f"code {code}" if code is not None else "an unknown status (adopted process)"
            self.last_error = f"server exited with {status}; restarting in {backoff:.0f}s"
            log.error("%s: %s", self.name, self.last_error)
            # Clean up whatever the dead leader left in its group before starting a new one.
            proc.signal_group(signal.SIGKILL)
            await self._pause(backoff)
            backoff = min(backoff * 2, self._backoff_max)
        self.state = STOPPED

    async def _spawn(self, backoff: float) -> ChildProcess | None:
        """Start a new server process; on conflict or failure pause `backoff` and return None."""
        if await self._port_in_use(self.port):
            self.state = CONFLICT
            self.last_error = (
                f"port {self.port} is already in use by a process the supervisor did not "
                "start; not starting a second server"
            )
            log.error("%s: %s", self.name, self.last_error)
            await self._pause(backoff)
            return None
        self.state = STARTING
        try:
            proc = await self._spawner.spawn(self.launch.argv, env=self.launch.env)
        except (OSError, ValueError) as exc:
            self.state = BACKOFF
            self.last_error = f"spawn failed: {exc}"
            log.error("%s: %s; retrying in %.0fs", self.name, self.last_error, backoff)
            await self._pause(backoff)
            return None
        record = ServerRecord(
            name=self.name,
            port=self.port,
            fingerprint=self.launch.fingerprint,
            started_at=self._clock.wall(),
            stamp=ProcessStamp.of(proc.pid),
            want_asleep=self._want_asleep,
        )
        self._begin_run(proc, record, adopted=False)
        log.info("%s: server started (pid %s) %s", self.name, proc.pid, self.launch.describe())
        return proc

    def _begin_run(self, proc: ChildProcess, record: ServerRecord, *, adopted: bool) -> None:
        self._proc = proc
        self.state = RUNNING
        self.adopted = adopted
        self.started_at = record.started_at
        self.fingerprint = record.fingerprint
        self._record = record
        if adopted:
            self._want_asleep = record.want_asleep
            self.last_error = None
            log.warning(
                "%s: adopted the server a previous supervisor started (pid %s, since %s)",
                self.name,
                proc.pid,
                iso_utc(record.started_at),
            )
        elif self._records is not None:
            self._records.save(record)

    def _end_run(self) -> None:
        self._proc = None
        self.fingerprint = None
        if self._record is not None and self._records is not None:
            self._records.drop(self._record)
        self._record = None

    async def _pause(self, seconds: float) -> None:
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait([sleeper, waker], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
