"""The simulated GPUs' shared state: which process holds how many MiB on which GPU.

One small JSON file per simulated host. Simulated engines and trainers write their own entries,
keyed by pid; a reader drops entries whose process is gone, so a SIGKILLed trainer's memory is
released exactly as a real driver would release it. Standard library only: the simulated
trainer imports this with nothing else installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Re-exported: tests and older callers import them from here.
from supervisor.procfs import pid_alive, process_start_time

# Declared in supervisor/settings.py (ChildEnvironment); spelled here so that the simulated
# trainer needs this module alone.
ENV_VAR = "HARU_SIM_GPU_STATE"
__all__ = ["ENV_VAR", "Holder", "SimGpuState", "pid_alive", "process_start_time"]


@dataclass(frozen=True)
class Holder:
    pid: int
    gpu_index: int
    label: str
    mib: int
    start_time: str | None = None
    # Simulates memory a driver failed to release: kept after its process is gone, as a
    # leaked CUDA context or a stray child outside the process group would keep it.
    leaked: bool = False


class SimGpuState:
    """Read and change the holders in one state file, under an fcntl lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # A sidecar lock file: the state file itself is replaced atomically on every write, so
        # a lock on it would guard an inode that no longer exists.
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def hold(
        self, gpu_index: int, mib: int, label: str, pid: int | None = None, *, leak: bool = False
    ) -> None:
        """Record that `pid` (default: this process) holds `mib` MiB on a GPU under `label`.

        With `leak` the entry outlives the process, as leaked GPU memory does: `release` keeps
        it, and only a fresh state file forgets it.
        """
        pid = pid or os.getpid()
        with self._locked(exclusive=True):
            holders = [
                h
                for h in self._load_live()
                if not (h.pid == pid and h.label == label and h.gpu_index == gpu_index)
            ]
            if mib > 0:
                holders.append(
                    Holder(pid, gpu_index, label, mib, process_start_time(pid), leaked=leak)
                )
            self._store(holders)

    def release(self, label: str | None = None, pid: int | None = None) -> None:
        """Drop this process's entries (all of them, or one label's)."""
        pid = pid or os.getpid()
        with self._locked(exclusive=True):
            holders = [
                h
                for h in self._load_live()
                # A leak outlives even a clean exit: that is what makes it a leak.
                if h.leaked or not (h.pid == pid and (label is None or h.label == label))
            ]
            self._store(holders)

    def holders(self) -> list[Holder]:
        """Return the entries of processes that are still alive."""
        with self._locked(exclusive=False):
            return self._load_live()

    def used_mib(self, gpu_index: int) -> int:
        return sum(h.mib for h in self.holders() if h.gpu_index == gpu_index)

    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _load_live(self) -> list[Holder]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            # A torn or hand-edited file must not take the GPU view down; start over.
            return []
        out: list[Holder] = []
        for item in data.get("holders", []) if isinstance(data, dict) else []:
            try:
                holder = Holder(
                    pid=int(item["pid"]),
                    gpu_index=int(item["gpuIndex"]),
                    label=str(item["label"]),
                    mib=int(item["mib"]),
                    start_time=item.get("startTime"),
                    leaked=bool(item.get("leaked", False)),
                )
            except (KeyError, TypeError, ValueError):
                continue
            if holder.leaked or pid_alive(holder.pid, holder.start_time):
                out.append(holder)
        return out

    def _store(self, holders: list[Holder]) -> None:
        payload = {
            "version": 1,
            "holders": [
                {
                    "pid": h.pid,
                    "gpuIndex": h.gpu_index,
                    "label": h.label,
                    "mib": h.mib,
                    "startTime": h.start_time,
                    **({"leaked": True} if h.leaked else {}),
                }
                for h in holders
            ],
        }
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
