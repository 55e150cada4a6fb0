"""Processes of a local Haru: started in sessions of their own, waited for with a deadline, and
stopped by process group (SIGTERM, a bounded grace, then SIGKILL), whatever happened.

A process in its own session leads its own process group, so one `killpg` reaches the children
it did not start in sessions of their own. Supervisors start their engines and trainers in
sessions of their own: those are found again by their PIDs (`Processes.adopt`), by a marker in
their environment (`pids_with_env`), or by the stamps a supervisor records (`ProcessBook`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from supervisor.records import ProcessStamp

from . import REPO

T = TypeVar("T")


class NotReady(AssertionError):
    """What a wait that ran out raises (an AssertionError, so a test reports it as a failure)."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    every: float = 0.05,
    *,
    gave_up: Callable[[], str | None] | None = None,
) -> T:
    """Poll `predicate` until it returns a truthy value and return it; fail naming `what`.

    `gave_up` returns why waiting longer is pointless (a process that exited), or None; the
    wait then fails at once with that reason instead of at its deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        reason = gave_up() if gave_up is not None else None
        if reason is not None:
            raise NotReady(f"gave up waiting for {what}: {reason}")
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last one
            last_error = exc
        else:
            if value:
                return value
        time.sleep(every)
    raise NotReady(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def log_tail(path: Path, lines: int = 40) -> str:
    """Return the last `lines` lines of a log file ("" if it does not exist)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def exited(proc: subprocess.Popen, log_path: Path, lines: int = 30) -> Callable[[], str | None]:
    """Return a `gave_up` for `wait_for`: the exit status and the log's last lines once `proc`
    exits."""

    def reason() -> str | None:
        status = proc.poll()
        if status is None:
            return None
        tail = log_tail(log_path, lines)
        return f"the process exited with status {status}; its log ends:\n{tail}"

    return reason


def spawn(
    argv: list[str],
    *,
    env: dict[str, str],
    log: Path,
    cwd: Path = REPO,
    preexec_fn: Callable[[], Any] | None = None,
) -> subprocess.Popen:
    """Start `argv` in a session of its own, its output appended to `log`."""
    with open(log, "ab") as out:  # the child holds its own copy
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,  # noqa: PLW1509 - a test's resource limit, set before exec
        )


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group `pid` leads; one already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_group_of(pid: int) -> None:
    """SIGKILL the process group `pid` belongs to."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)


def stop(proc: subprocess.Popen, grace_s: float = 10, sig: int = signal.SIGTERM) -> None:
    """Signal `proc`'s group (SIGTERM: an orderly stop), wait `grace_s`, then SIGKILL it."""
    if proc.poll() is None:
        kill_group(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    kill_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def pids_with_env(marker: str) -> list[int]:
    """Return the live processes whose environment mentions `marker` (a private directory)."""
    needle = marker.encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


class Processes:
    """Named processes logging to one directory; `cleanup` stops every group it started."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.extra_pids: set[int] = set()

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        return self.add(name, spawn(argv, env=env, log=self.log_path(name)))

    def add(self, name: str, proc: subprocess.Popen) -> subprocess.Popen:
        """Take a process started in a session of its own (logging to `log_path(name)`)."""
        self.procs.append((name, proc))
        return proc

    def adopt(self, pids: Iterable[int]) -> None:
        """Remember processes in groups of their own (a supervisor's engines and trainers), so
        cleanup kills them even if their supervisor died first."""
        self.extra_pids.update(pids)

    def log_tail(self, name: str, lines: int = 40) -> str:
        return log_tail(self.log_path(name), lines)

    def cleanup(self, grace_s: float = 8) -> None:
        # SIGTERM first: supervisors stop their engines and trainers on the way out.
        for _, proc in self.procs:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for pgid in [p.pid for _, p in self.procs] + sorted(self.extra_pids):
            kill_group(pgid)
        for pid in sorted(self.extra_pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=3)


class ProcessBook:
    """Processes recorded by stamp (pid, kernel start time, boot id) in a directory, so a later
    command signals exactly them and never a process that reused one's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _file(self, name: str) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path / f"{name}.json"

    def record(self, name: str, proc: subprocess.Popen) -> None:
        """Remember a process started in a new session (it leads its group)."""
        self._file(name).write_text(json.dumps(ProcessStamp.of(proc.pid).to_json()))

    def alive(self, name: str) -> ProcessStamp | None:
        """Return the recorded process `name` if it still runs (the same one, not a reused pid)."""
        path = self._file(name)
        try:
            stamp = ProcessStamp.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if stamp.is_alive():
            return stamp
        path.unlink(missing_ok=True)
        return None


def kill_stamps(stamps: Iterable[ProcessStamp], sig: int = signal.SIGKILL) -> int:
    """Signal each still-live process's group (a trainer's workers die with it); return how
    many were signalled."""
    killed = 0
    for stamp in stamps:
        if not stamp.is_alive():  # checked again right before: the pid may be reused since
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(stamp.pgid, sig)
            killed += 1
    return killed


def stop_stamps(
    stamps: list[ProcessStamp], procs: Iterable[subprocess.Popen], grace_s: float
) -> None:
    """SIGTERM each recorded group and wait (bounded) until they are gone or `grace_s` passed;
    `procs` are this process's own children among them, reaped as they exit."""
    kill_stamps(stamps, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    while any(stamp.is_alive() for stamp in stamps) and time.monotonic() < deadline:
        time.sleep(0.1)
