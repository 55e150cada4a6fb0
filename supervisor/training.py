"""Training slots: start the configured trainer, stop it with SIGTERM then SIGKILL.

The trainer contract: the command is spawned exactly as written, in its own process group,
with the allowed part of the parent environment (`child_env.py`) plus HARU_CHECKPOINT_DIR,
HARU_GPU_INDEX, CUDA_VISIBLE_DEVICES (numbered as NVML numbers GPUs:
CUDA_DEVICE_ORDER=PCI_BUS_ID) and, when the plan gives one, HARU_GPU_MEMORY_LIMIT_MIB (the most
GPU memory it may use), and never the supervisor's token, config or other secrets. Failover
never waits for a perfect checkpoint: after the grace period the group is killed, and trainers
must resume from what they saved.

A running trainer is recorded in the state directory, so a supervisor restarted after a crash
adopts it (see `adoption.py`) instead of losing sight of a process that holds the GPU.
`lastCheckpointAt` is the newest mtime in HARU_CHECKPOINT_DIR, read on every status call, and
`lastAdapterAt` the newest mtime of a completed adapter's marker there (`haru-adapter.json`,
docs/adapters.md): the control plane lists the adapters only when that moves, not on every
periodic checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.adapter_manifest import MANIFEST_NAME
from supervisor.child_env import inherited_env
from supervisor.clock import Clock, iso_utc
from supervisor.config import TrainingSlotConfig
from supervisor.processes import AdoptedProcess, ChildProcess, Spawner
from supervisor.records import ProcessStamp, StateDir, TrainerRecord
from supervisor.settings import ChildEnvironment

log = logging.getLogger(__name__)

IDLE = "idle"
RUNNING = "running"
STOPPING = "stopping"


class TrainingBusy(Exception):
    """A start arrived while the previous trainer is still being stopped."""


class SpawnFailed(Exception):
    """The trainer could not be started; the slot is idle again."""


def trainer_env(
    slot: TrainingSlotConfig, environ: Mapping[str, str], host_env: Mapping[str, str]
) -> dict[str, str]:
    """Build the trainer's environment: the allowed part of the parent's, + the contract's
    variables."""
    env = inherited_env(environ)
    env.update(host_env)
    env[ChildEnvironment.checkpoint_dir.env] = str(slot.checkpoint_dir)
    env[ChildEnvironment.gpu_index.env] = str(slot.gpu_index)
    if slot.memory_limit_mib is not None:
        # The plan's budget: what the sleeping servers leave, less a margin (trainer contract).
        env[ChildEnvironment.gpu_memory_limit_mib.env] = str(slot.memory_limit_mib)
    # A trainer that guesses its GPU grabs GPU 0, which on a standby is usually where the
    # sleeping servers live; pinning it is what keeps the wake path free.
    env["CUDA_VISIBLE_DEVICES"] = str(slot.gpu_index)
    # The pin is an NVML index, but CUDA numbers GPUs fastest-first unless told otherwise: on a
    # host with mixed cards, "1" would be another GPU than the one verify_gpu watches. Model
    # servers get the same from their launch environment.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def newest_adapter_mtime(directory: Path) -> float | None:
    """The mtime of the newest completed adapter's marker (`<entry>/haru-adapter.json`) in a
    checkpoint dir, or None. One `scandir` and a stat per directory entry (a trainer keeps a
    handful); unreadable entries are skipped: status must never fail over this."""
    newest: float | None = None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    mtime = os.stat(os.path.join(entry.path, MANIFEST_NAME)).st_mtime
                except OSError:
                    continue  # not an adapter (or pruned between the listing and the stat)
                if newest is None or mtime > newest:
                    newest = mtime
    except OSError:
        return None
    return newest


def newest_checkpoint_mtime(directory: Path) -> float | None:
    """Return the mtime of the newest entry in a checkpoint dir, or None when there is none.

    One `scandir`, no recursion: a checkpoint saved as a directory (`checkpoint-500/`) counts
    by the directory's own mtime, which moves whenever a file is added to it. Dot-files are
    skipped: they are writes in progress (temporary files renamed into place when complete).
    Status must never fail over this, so an unreadable or missing dir reads as None.
    """
    newest: float | None = None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue  # deleted between the listing and the stat (checkpoint pruning)
                if newest is None or mtime > newest:
                    newest = mtime
    except OSError:
        return None
    return newest


class TrainingSlot:
    """Run at most one trainer on one GPU, and stop it within a deadline."""

    def __init__(
        self,
        config: TrainingSlotConfig,
        *,
        spawner: Spawner,
        clock: Clock,
        environ: Mapping[str, str],
        host_env: Mapping[str, str] | None = None,
        records: StateDir | None = None,
    ) -> None:
        self.config = config
        self._spawner = spawner
        self._clock = clock
        self._environ = environ
        self._host_env = dict(host_env or {})
        self._records = records
        self._record: TrainerRecord | None = None
        self.adopted = False
        self.state = IDLE
        self._proc: ChildProcess | None = None
        self._deadline: float | None = None
        self._deadline_moved = asyncio.Event()
        self._exited = asyncio.Event()
        self._exited.set()
        self._killer: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        # Serialises start and stop so two starts cannot both spawn.
        self._lock = asyncio.Lock()
        self.started_at: float | None = None
        self.stop_requested_at: float | None = None
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.killed = False

    @property
    def gpu_index(self) -> int:
        return self.config.gpu_index

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self.state != IDLE else None

    async def start(self) -> None:
        """Start the trainer unless it is already running; raise TrainingBusy or SpawnFailed."""
        async with self._lock:
            if self.state == RUNNING:
                return
            if self.state == STOPPING:
                raise TrainingBusy(
                    f"training on GPU {self.gpu_index} is still stopping; retry once it is idle"
                )
            env = trainer_env(self.config, self._environ, self._host_env)
            try:
                self.config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
                proc = await self._spawner.spawn(self.config.command, env=env)
            except (OSError, ValueError) as exc:
                self.state = IDLE
                self.last_error = f"spawn failed: {exc}"
                log.error("training on GPU %s: %s", self.gpu_index, self.last_error)
                raise SpawnFailed(self.last_error) from exc
            record = TrainerRecord(
                gpu_index=self.gpu_index,
                command=self.config.command,
                started_at=self._clock.wall(),
                stamp=ProcessStamp.of(proc.pid),
            )
            self._run(proc, record, adopted=False)
            if self._records is not None:
                self._records.save(record)
            log.info("training on GPU %s started: pid %s", self.gpu_index, proc.pid)

    def adopt(self, proc: AdoptedProcess, record: TrainerRecord) -> None:
        """Take over the trainer a previous supervisor started on this GPU; stop it as usual."""
        if self.state != IDLE:
            raise RuntimeError(f"training on GPU {self.gpu_index} is already {self.state}")
        self._run(proc, record, adopted=True)
        log.warning(
            "training on GPU %s: adopted the trainer a previous supervisor started "
            "(pid %s, since %s)",
            self.gpu_index,
            proc.pid,
            iso_utc(record.started_at),
        )

    def _run(self, proc: ChildProcess, record: TrainerRecord, *, adopted: bool) -> None:
        self._proc = proc
        self._record = record
        self.adopted = adopted
        self.state = RUNNING
        self.started_at = record.started_at
        self.stop_requested_at = None
        self.last_error = None
        self.last_exit_code = None
        self.killed = False
        self._deadline = None
        self._exited = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch(proc), name=f"trainer-{proc.pid}")

    def stop(self, grace_ms: int | None = None) -> None:
        """Ask the trainer to stop: SIGTERM now, SIGKILL at the deadline.

        A later stop may bring the deadline forward, never push it back: the caller that is
        in a hurry (a failover) must not be slowed by one that is not.
        """
        if self.state == IDLE or self._proc is None:
            return
        grace_s = (grace_ms if grace_ms is not None else self.config.grace_ms) / 1000
        deadline = self._clock.monotonic() + grace_s
        if self.state == RUNNING:
            self.state = STOPPING
            self.stop_requested_at = self._clock.wall()
            self._deadline = deadline
            log.info(
                "training on GPU %s: SIGTERM to group %s, SIGKILL in %.1fs",
                self.gpu_index,
                self._proc.pid,
                grace_s,
            )
            self._proc.signal_group(signal.SIGTERM)
            self._killer = asyncio.create_task(self._enforce_deadline(self._proc))
        elif self._deadline is None or deadline < self._deadline:
            self._deadline = deadline
            self._deadline_moved.set()

    def kill_in(self) -> float | None:
        """Seconds until the stopping trainer is SIGKILLed (0 when overdue), None when it is
        not stopping."""
        if self.state != STOPPING or self._deadline is None:
            return None
        return max(0.0, self._deadline - self._clock.monotonic())

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no trainer runs; False on timeout."""
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def kill_now(self) -> None:
        """SIGKILL the group at once (hard exit path)."""
        if self._proc is not None and self.state != IDLE:
            self._proc.signal_group(signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        pid = self.pid
        return {
            "state": self.state,
            "pids": [pid] if pid is not None else [],
            "startedAt": iso_utc(self.started_at) if self.state != IDLE else None,
            "stopRequestedAt": iso_utc(self.stop_requested_at) if self.state == STOPPING else None,
            "lastExitCode": self.last_exit_code,
            "lastError": self.last_error,
            "killed": self.killed,
            "graceMs": self.config.grace_ms,
            "checkpointDir": str(self.config.checkpoint_dir),
            "lastCheckpointAt": iso_utc(newest_checkpoint_mtime(self.config.checkpoint_dir)),
            "lastAdapterAt": iso_utc(newest_adapter_mtime(self.config.checkpoint_dir)),
            "adopted": self.adopted and self.state != IDLE,
        }

    async def _enforce_deadline(self, proc: ChildProcess) -> None:
        while proc.returncode is None and not self._exited.is_set():
            remaining = (self._deadline or 0) - self._clock.monotonic()
            if remaining <= 0:
                log.warning(
                    "training on GPU %s did not exit within its grace; SIGKILL to group %s",
                    self.gpu_index,
                    proc.pid,
                )
                self.killed = True
                proc.signal_group(signal.SIGKILL)
                return
            self._deadline_moved.clear()
            waiters = [
                asyncio.ensure_future(self._clock.sleep(remaining)),
                asyncio.ensure_future(self._deadline_moved.wait()),
                asyncio.ensure_future(self._exited.wait()),
            ]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    async def _watch(self, proc: ChildProcess) -> None:
        code = await proc.wait()
        stopping = self.state == STOPPING
        if stopping:
            # The leader is gone, but helpers it forked (data loaders) may still hold GPU memory.
            proc.signal_group(signal.SIGKILL)
        self.last_exit_code = code
        if self._record is not None and self._records is not None:
            self._records.drop(self._record)
        self._record = None
        if not stopping:
            log.warning("training on GPU %s exited by itself with code %s", self.gpu_index, code)
            if code is None:
                # An adopted trainer is not our child: its exit status went to init.
                self.last_error = "adopted trainer exited by itself (exit status unknown)"
            elif code != 0:
                self.last_error = f"trainer exited with code {code}"
        else:
            log.info("training on GPU %s stopped (exit code %s)", self.gpu_index, code)
        self.state = IDLE
        self._deadline = None
        self._exited.set()
        if self._killer is not None:
            self._killer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._killer
            self._killer = None
