"""Spawning child processes in their own process group; injectable so tests can script it."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from supervisor.records import ProcessStamp


class ChildProcess(Protocol):
    """A spawned (or adopted) process; its pid is also its process group id."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int | None:
        """Wait for the exit; return the status, or None when it cannot be known (adopted)."""
        ...

    def signal_group(self, sig: int) -> bool:
        """Signal the whole process group; False when nothing is left in it."""
        ...


class Spawner(Protocol):
    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None
    ) -> ChildProcess:
        """Start argv exactly as given (no shell) in a new session; raise OSError on failure."""
        ...


class AsyncioChild:
    """A real child process started through asyncio."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    def signal_group(self, sig: int) -> bool:
        return signal_group(self.pid, sig)


class AsyncioSpawner:
    """Start real processes, each in a new session so its whole tree can be signalled at once."""

    async def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None
    ) -> ChildProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=str(cwd) if cwd else None,
            stdin=subprocess.DEVNULL,
            # A new session makes the child a process-group leader: vLLM workers, data loaders
            # and anything else it forks share the group and die with one killpg.
            start_new_session=True,
        )
        return AsyncioChild(proc)


class AdoptedProcess:
    """A process a previous supervisor started: not our child, so watched through /proc.

    Nobody here can `waitpid` it (init reaps it), so `wait` polls whether the stamped process
    still exists, and its exit status is never known.
    """

    def __init__(self, stamp: ProcessStamp, *, poll_s: float = 0.1) -> None:
        self.stamp = stamp
        self.pid = stamp.pid
        self._poll_s = poll_s

    @property
    def returncode(self) -> int | None:
        return None

    async def wait(self) -> int | None:
        while self.stamp.is_alive():
            await asyncio.sleep(self._poll_s)
        return None

    def signal_group(self, sig: int) -> bool:
        return signal_group(self.stamp.pgid, sig)


def signal_group(pgid: int, sig: int) -> bool:
    """Send a signal to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # The pgid was recycled by someone else's process: ours is gone.
        return False
    return True
