"""Process identity from /proc: is this pid still the process we think it is?

A pid alone names a process only until it exits; the kernel hands the number out again. The
start time in `/proc/<pid>/stat` (clock ticks since boot) together with the boot id tells the
original from a later process that got the same number. Standard library only: the simulated
trainer imports this through `supervisor.gpu.sim_state` with nothing else installed.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def process_start_time(pid: int) -> str | None:
    """Return the kernel's start time of a process (guards against pid reuse), if readable."""
    stat = _read_stat(pid)
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # Field 22 of /proc/<pid>/stat is starttime; after the ")" split it is index 19.
    return fields[19] if len(fields) > 19 else None


@functools.cache
def boot_id() -> str | None:
    """Return this boot's id; start times are only comparable within one boot.

    Cached: it cannot change while this process lives, and liveness polls ask for it often.
    """
    try:
        return BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def pid_alive(pid: int, start_time: str | None = None) -> bool:
    """Tell whether a process is alive: not gone, not a zombie, not a reused pid."""
    stat = _read_stat(pid)
    if stat is None:
        if Path("/proc/self/stat").exists():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = stat.rsplit(")", 1)[-1].split()
    # A zombie holds no memory: the kernel freed it at exit, only the pid awaits reaping.
    if fields and fields[0] in ("Z", "X"):
        return False
    return not (start_time and len(fields) > 19 and fields[19] != start_time)


def same_process(pid: int, start_time: str | None, recorded_boot_id: str | None) -> bool:
    """Tell whether `pid` is still the very process that had `start_time` in that boot.

    Stricter than `pid_alive`: without a recorded start time, or on another boot, the answer is
    no, because adopting a stranger (and later signalling its group) is far worse than starting
    a fresh server.
    """
    if pid <= 1 or not start_time:
        return False
    if recorded_boot_id is not None and recorded_boot_id != boot_id():
        return False
    return process_start_time(pid) == start_time and pid_alive(pid, start_time)


def process_group(pid: int) -> int | None:
    """Return the process group of `pid`, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _read_stat(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
