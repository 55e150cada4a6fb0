"""The state directory: one small file per running managed server and trainer.

Managed servers and trainers run in sessions of their own, so they outlive a supervisor that is
SIGKILLed or crashes; that is deliberate, because the active host's servers must keep serving
through a supervisor crash. These records are how the next supervisor finds them again and
adopts them instead of reporting their ports as taken by a stranger.

A record is written when a process is started and deleted when it exits or is stopped. Each
carries the process's kernel start time and the boot id, so a pid the kernel has since handed
to another process is never adopted (or signalled).

Writes are atomic (temporary file, then rename) but not fsynced: records only matter while the
processes they name are alive, and a host crash that loses the page cache also kills those.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Annotated, Any, ClassVar

from common.wire.codec import Wire, WireRecord
from supervisor.clock import iso_utc
from supervisor.procfs import boot_id, process_group, process_start_time, same_process

log = logging.getLogger(__name__)

VERSION = 1
LOCK_NAME = "supervisor.lock"


class StateDirBusy(Exception):
    """Another live supervisor holds this state directory."""


@dataclass(frozen=True)
class ProcessStamp(WireRecord):
    """What identifies one process across a supervisor restart."""

    pid: int
    pgid: int
    start_time: Annotated[str | None, Wire("procStartTime")]
    boot_id: str | None

    @classmethod
    def of(cls, pid: int) -> ProcessStamp:
        """Stamp a process just spawned (in a new session, so its pgid is its pid)."""
        return cls(pid, process_group(pid) or pid, process_start_time(pid), boot_id())

    def is_alive(self) -> bool:
        """Tell whether the stamped process still runs (and is not a later reuse of its pid)."""
        return same_process(self.pid, self.start_time, self.boot_id)


def _timestamp(value: Any) -> float:
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {value!r}")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# Written as ISO 8601 UTC, so a person reading the state directory sees when.
StartedAt = Annotated[float, Wire(encode=iso_utc, decode=_timestamp)]
# The process's stamp is spread in the record itself, not nested under a key.
Stamp = Annotated[ProcessStamp, Wire(flatten=True)]


class _Record(WireRecord):
    """A record's file: its version and kind, then its fields (common/wire/codec.py)."""

    KIND: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "kind": self.KIND, **super().to_json()}


@dataclass(frozen=True)
class ServerRecord(_Record):
    """A managed model server some supervisor started on this host."""

    KIND: ClassVar[str] = "server"

    name: str
    port: int
    fingerprint: str | None
    started_at: StartedAt
    stamp: Stamp
    # What the supervisor last asked for and last saw confirmed, so that an adopted server
    # that later crashes is put back to sleep, and an engine without a status endpoint
    # (SGLang) still has a known state after the restart.
    want_asleep: bool | None = None
    sleeping: bool | None = None

    @property
    def filename(self) -> str:
        # Ports are unique on a host and safe in a file name; model names may hold "/".
        return f"server-{self.port}.json"


@dataclass(frozen=True)
class TrainerRecord(_Record):
    """A trainer some supervisor started on this host."""

    KIND: ClassVar[str] = "trainer"

    gpu_index: int
    command: tuple[str, ...]
    started_at: StartedAt
    stamp: Stamp

    @property
    def filename(self) -> str:
        return f"trainer-gpu{self.gpu_index}.json"


def _object(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"not an object: {value!r}")
    return value


@dataclass(frozen=True)
class SwapRecord(_Record):
    """A model whose server was swapped to a profile other than the config's (supervisor/swaps.py).

    It outlives the processes: a restarted supervisor builds that model from this profile and
    port instead of the config's, so it adopts the swapped server. It holds only while the
    config's entry is still the one the swap replaced (`base_port`, `base_fingerprint`): an
    operator who edits the config's entry has said what to run, and the record is dropped.
    The API key is kept by reference (`env` or `file`), never the key.
    """

    KIND: ClassVar[str] = "swap"

    name: str
    port: int
    mode: str
    profile: Annotated[Mapping[str, Any], Wire(decode=_object)]
    api_key_env: str | None
    api_key_file: str | None
    base_port: int
    base_fingerprint: str | None
    previous_port: int
    swapped_at: StartedAt

    @property
    def filename(self) -> str:
        return swap_filename(self.name)


def swap_filename(name: str) -> str:
    # Model names may hold "/" and other characters a file name must not: a digest of it.
    return f"swap-{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"


Record = ServerRecord | TrainerRecord
AnyRecord = Record | SwapRecord
RECORD_KINDS: dict[Any, type[AnyRecord]] = {
    k.KIND: k for k in (ServerRecord, TrainerRecord, SwapRecord)
}


@dataclass(frozen=True)
class Loaded:
    servers: Sequence[ServerRecord]
    trainers: Sequence[TrainerRecord]
    swaps: Sequence[SwapRecord] = ()


class StateDir:
    """Read and write the records of one supervisor's children."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: IO[str] | None = None

    def acquire(self) -> None:
        """Create the directory and lock it for this process's lifetime; raise StateDirBusy.

        Two live supervisors sharing one directory would adopt (and stop) each other's children.
        The flock dies with the process, so a SIGKILLed supervisor never leaves it held.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        # Opened by Python, so close-on-exec: children never inherit the lock.
        lock = open(self.path / LOCK_NAME, "a+")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.close()
            raise StateDirBusy(f"{self.path} is in use by another running supervisor") from exc
        self._lock = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def save(self, record: AnyRecord) -> None:
        """Write a record atomically; log (never raise) on failure.

        The process is already running when this is called: failing its start over a record
        would be worse than a restart that cannot adopt it.
        """
        target = self.path / record.filename
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".record-", dir=self.path)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(record.to_json(), f, indent=1)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.error("cannot write %s (a restart could not adopt this process): %s", target, exc)

    def drop(self, record: Record) -> None:
        """Delete a record, but only if it still names the same process.

        A record may already have been replaced by the next process's; that one must stay.
        """
        target = self.path / record.filename
        current = self._read(target)
        if isinstance(current, SwapRecord):
            return
        if current is not None and current.stamp.pid != record.stamp.pid:
            return
        self._unlink(target)

    def forget_swap(self, name: str) -> None:
        """Delete the swap record of model `name` (its server runs the config's profile again)."""
        self._unlink(self.path / swap_filename(name))

    @staticmethod
    def _unlink(target: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            try:
                target.unlink()
            except OSError as exc:
                log.error("cannot delete %s: %s", target, exc)

    def load(self) -> Loaded:
        """Return every readable record; unreadable files are logged and deleted."""
        servers: list[ServerRecord] = []
        trainers: list[TrainerRecord] = []
        swaps: list[SwapRecord] = []
        try:
            entries = sorted(self.path.iterdir())
        except FileNotFoundError:
            return Loaded((), ())
        for entry in entries:
            if entry.name.startswith(".record-"):
                # A write the previous supervisor did not finish: nothing was renamed into place.
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            if not entry.name.endswith(".json"):
                continue
            record = self._read(entry)
            if record is None:
                log.warning("unreadable record %s deleted", entry)
                with contextlib.suppress(OSError):
                    entry.unlink()
            elif isinstance(record, ServerRecord):
                servers.append(record)
            elif isinstance(record, SwapRecord):
                swaps.append(record)
            else:
                trainers.append(record)
        return Loaded(servers, trainers, swaps)

    @staticmethod
    def _read(path: Path) -> AnyRecord | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("version") != VERSION:
                return None
            kind = RECORD_KINDS.get(data.get("kind"))
            if kind is not None:
                return kind.from_json(data)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return None


# The adapters each model's server should have loaded (docs/adapters.md), one file per model in
# a folder of its own: `load()` above reads only the top level. Kept while the processes come and
# go: a restarted or woken server gets them loaded again, and a restarted supervisor knows them.
ADAPTER_LOADS = "adapter-loads"
# Adapters wanted per model at most: an engine holds a handful (its maxLoras).
MAX_WANTED_ADAPTERS = 16


class AdapterLoads:
    """Read and write the wanted adapters (engine name -> store id) of each model."""

    def __init__(self, state: Path | None) -> None:
        self.path = state / ADAPTER_LOADS if state is not None else None

    def _file(self, model: str) -> Path:
        assert self.path is not None
        return self.path / f"{hashlib.sha256(model.encode()).hexdigest()[:16]}.json"

    def save(self, model: str, wanted: Mapping[str, str]) -> None:
        """Write atomically (delete when empty); log, never raise: the engine call is what
        counts now, this record only what happens after a restart."""
        if self.path is None:
            return
        target = self._file(model)
        try:
            if not wanted:
                target.unlink(missing_ok=True)
                return
            self.path.mkdir(parents=True, exist_ok=True)
            body = {
                "version": VERSION,
                "kind": "adapter-loads",
                "model": model,
                "wanted": dict(wanted),
            }
            fd, tmp = tempfile.mkstemp(prefix=".record-", dir=self.path)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(body, f, indent=1)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.error("cannot write %s (a restart would not reload its adapters): %s", target, exc)

    def load(self) -> dict[str, dict[str, str]]:
        """Every model's wanted adapters; unreadable files are logged and skipped."""
        out: dict[str, dict[str, str]] = {}
        if self.path is None or not self.path.is_dir():
            return out
        for entry in sorted(self.path.glob("*.json")):
            try:
                data = json.loads(entry.read_text(encoding="utf-8"))
                wanted = data["wanted"]
                model = data["model"]
                if data.get("version") != VERSION or not isinstance(model, str):
                    raise ValueError("not a record of this version")
                if not isinstance(wanted, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in wanted.items()
                ):
                    raise ValueError("wanted is not a map of names to ids")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("unreadable adapter record %s skipped: %s", entry, exc)
                continue
            out[model] = dict(list(wanted.items())[:MAX_WANTED_ADAPTERS])
        return out
