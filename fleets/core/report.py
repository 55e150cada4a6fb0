"""A supervisor's report, normalized once: the model every reader reads, and its one reader.

A `GET /v1/status` body (and a `GET /v1/gpu/memory` body) is checked against the wire contract
on arrival (`fleets.reconciler.supervisor.reports`) and turned into these frozen values there.
The heartbeat stores the domain's last report (`Domain.last_report`) as `DomainReport.to_json()`,
and everything that shows or judges it (the reconciler, readiness, the dashboard, the GPU plan,
the metrics) reads it back through `read_report`, the one reader.

`read_report` never raises: each field that is missing or malformed reads as unknown (None, or
left out), never as an error. That is also what keeps the rows written before this form
readable: they hold the status body as the supervisor sent it, which this reader reads too. A
dashboard that crashes on a bad heartbeat is useless during the incident that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from functools import cached_property
from typing import Any

from common.strict_json import is_number, whole_int
from fleets.core.timestamps import utc_iso


class TrainerReportState(StrEnum):
    """A trainer's state as its supervisor reports it (`/v1/status`, `/v1/training/status`);
    any other value reads as unknown."""

    IDLE = "idle"
    RUNNING = "running"
    STOPPING = "stopping"


# Slot kinds as the wire spells them (`fleets.core.states.SlotKind` holds the same values).
INFERENCE, TRAINING = "inference", "training"
# The longest engine version kept: the width of the bindings' and baselines' columns.
ENGINE_VERSION_MAX = 64


@dataclass(frozen=True)
class ModelReport:
    name: str
    sleeping: bool | None  # None: the supervisor could not tell
    error: str | None = None
    draining: bool = False  # a sleep is letting running requests finish first
    # The engine's version (its `GET /version`), ours only; None when not reported.
    engine_version: str | None = None
    fingerprint: str | None = None  # the running server's launch fingerprint, ours only
    pid: int | None = None  # the server's process, when the supervisor manages it


@dataclass(frozen=True)
class TrainingReport:
    state: str | None  # a TrainerReportState; None: not reported in a form we know
    pids: tuple[int, ...] = ()
    checkpoint_at: datetime | None = None
    last_error: str | None = None
    # The newest completed adapter's marker (our supervisor's `lastAdapterAt`): what the
    # adapter pass watches, read live from each beat and never stored.
    adapter_at: datetime | None = None

    @property
    def running_with_pid(self) -> bool:
        # A trainer that says "running" but has no PID has not proven it runs.
        return self.state == TrainerReportState.RUNNING and bool(self.pids)


@dataclass(frozen=True)
class SlotReport:
    gpu_index: int
    kind: str
    models: tuple[ModelReport, ...] = ()
    training: TrainingReport | None = None


@dataclass(frozen=True)
class PlanMismatch:
    """Where the GPU plan a host was configured from does not match its real GPUs."""

    code: str
    message: str
    gpu_index: int | None = None


@dataclass(frozen=True)
class StatusReport:
    """A `GET /v1/status` answer."""

    slots: tuple[SlotReport, ...]
    ready: bool
    # What the supervisor accepts beyond the original contract (empty on the original).
    features: frozenset[str] = frozenset()
    plan_mismatches: tuple[PlanMismatch, ...] = ()
    # The checked body as sent, when it came off the wire (never stored: `to_json` is).
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def model(self, name: str) -> ModelReport | None:
        return self._models.get(name)

    def training(self, gpu_index: int) -> TrainingReport | None:
        return self._trainings.get(gpu_index)

    def models(self) -> dict[str, ModelReport]:
        """Every reported model server, by name (the first slot naming it wins)."""
        return dict(self._models)

    def trainings(self) -> dict[int, TrainingReport]:
        """Every reported trainer, by GPU index."""
        return dict(self._trainings)

    # Indexed once per report: a beat looks up every binding by name.
    @cached_property
    def _models(self) -> dict[str, ModelReport]:
        out: dict[str, ModelReport] = {}
        for slot in self.slots:
            for m in slot.models:
                out.setdefault(m.name, m)
        return out

    @cached_property
    def _trainings(self) -> dict[int, TrainingReport]:
        return {
            s.gpu_index: s.training
            for s in self.slots
            if s.kind == TRAINING and s.training is not None
        }


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: float | None = None
    name: str | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG partition: memory is accounted per instance, not per parent GPU."""

    gpu_instance_id: int | None
    used_mib: float | None
    total_mib: float | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class GpuReport:
    """One GPU's memory. A MIG card's parent figures are its instances' sums when the card did
    not give its own."""

    index: int
    used_mib: float | None
    total_mib: float | None
    name: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_enabled: bool = False
    mig: tuple[MigInstance, ...] = ()
    simulated: bool = False

    @property
    def used_ratio(self) -> float:
        if self.used_mib is None or not self.total_mib:
            return 1.0  # unknown reads as full: nothing is placed on a guess
        return self.used_mib / self.total_mib

    @property
    def all_processes(self) -> tuple[GpuProcess, ...]:
        """The processes holding memory: the card's own list, else its instances'."""
        return self.processes or tuple(p for i in self.mig for p in i.processes)


@dataclass(frozen=True)
class GpuMemory:
    """A `GET /v1/gpu/memory` answer."""

    gpus: tuple[GpuReport, ...]
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def gpu(self, index: int) -> GpuReport | None:
        return next((g for g in self.gpus if g.index == index), None)


@dataclass(frozen=True)
class ReadError:
    """Why a heartbeat or a GPU memory read got no answer (a call error, as stored)."""

    kind: str
    message: str
    status: int | None = None
    at: datetime | None = None  # when it was asked (GPU reads)


@dataclass(frozen=True)
class HeartbeatNote:
    """How the last heartbeat went, for the dashboard; nothing decides on it (the columns
    `heartbeat_checked_at` and `heartbeat_failing_since` are what the reconciler reads)."""

    ok: bool
    checked_at: datetime | None = None
    failing_since: datetime | None = None
    error: ReadError | None = None


@dataclass(frozen=True)
class DomainReport:
    """What `Domain.last_report` holds: the last good status, the last GPU memory answer (or
    why there is none) and how the last heartbeat went. Every part may be unknown."""

    status: StatusReport | None = None
    gpus: tuple[GpuReport, ...] = ()
    gpus_at: datetime | None = None
    gpus_error: ReadError | None = None
    heartbeat: HeartbeatNote | None = None

    @property
    def empty(self) -> bool:
        return self == DomainReport()

    def models(self) -> dict[str, ModelReport]:
        return self.status.models() if self.status is not None else {}

    def trainings(self) -> dict[int, TrainingReport]:
        return self.status.trainings() if self.status is not None else {}

    def to_json(self) -> dict[str, Any]:
        """The stored form: the status's fields at the top (as the wire has them), then the GPU
        keys and the heartbeat note. Unknown parts are left out."""
        out: dict[str, Any] = {}
        if self.status is not None:
            out.update(_status_json(self.status))
        if self.gpus:
            out["gpus"] = [_gpu_json(g) for g in self.gpus]
        if self.gpus_at is not None:
            out["gpusAt"] = utc_iso(self.gpus_at)
        if self.gpus_error is not None:
            out["gpusError"] = read_error_json(self.gpus_error)
        if self.heartbeat is not None:
            out["heartbeat"] = heartbeat_json(self.heartbeat)
        return out


# -- the stored form ---------------------------------------------------------------------------


def _mib(value: float) -> int | float:
    """A whole MiB count is written as an integer."""
    return int(value) if float(value).is_integer() else value


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


def _model_json(m: ModelReport) -> dict[str, Any]:
    out: dict[str, Any] = {"name": m.name, "sleeping": m.sleeping}
    _put(out, "error", m.error)
    if m.draining:
        out["draining"] = True
    _put(out, "engineVersion", m.engine_version)
    _put(out, "fingerprint", m.fingerprint)
    _put(out, "pid", m.pid)
    return out


def _slot_json(s: SlotReport) -> dict[str, Any]:
    out: dict[str, Any] = {"gpuIndex": s.gpu_index, "kind": s.kind}
    if s.kind == INFERENCE:
        out["models"] = [_model_json(m) for m in s.models]
    if s.training is not None:
        t = s.training
        training: dict[str, Any] = {"pids": list(t.pids)}
        _put(training, "state", t.state)
        _put(training, "lastCheckpointAt", utc_iso(t.checkpoint_at) if t.checkpoint_at else None)
        _put(training, "lastError", t.last_error)
        out["training"] = training
    return out


def _status_json(status: StatusReport) -> dict[str, Any]:
    out: dict[str, Any] = {
        "slots": [_slot_json(s) for s in status.slots],
        "ready": status.ready,
        "features": sorted(status.features),
    }
    if status.plan_mismatches:
        out["planMismatches"] = [
            {
                **({"gpuIndex": p.gpu_index} if p.gpu_index is not None else {}),
                "code": p.code,
                "message": p.message,
            }
            for p in status.plan_mismatches
        ]
    return out


def _processes_json(processes: tuple[GpuProcess, ...]) -> list[dict[str, Any]]:
    out = []
    for p in processes:
        entry: dict[str, Any] = {"pid": p.pid}
        _put(entry, "usedMiB", _mib(p.used_mib) if p.used_mib is not None else None)
        _put(entry, "name", p.name)
        out.append(entry)
    return out


def _gpu_json(g: GpuReport) -> dict[str, Any]:
    out: dict[str, Any] = {"index": g.index}
    _put(out, "usedMiB", _mib(g.used_mib) if g.used_mib is not None else None)
    _put(out, "totalMiB", _mib(g.total_mib) if g.total_mib is not None else None)
    _put(out, "name", g.name)
    out["processes"] = _processes_json(g.processes)
    if g.mig_enabled or g.mig:
        instances = []
        for i in g.mig:
            entry: dict[str, Any] = {}
            _put(entry, "gpuInstanceId", i.gpu_instance_id)
            _put(entry, "usedMiB", _mib(i.used_mib) if i.used_mib is not None else None)
            _put(entry, "totalMiB", _mib(i.total_mib) if i.total_mib is not None else None)
            entry["processes"] = _processes_json(i.processes)
            instances.append(entry)
        out["mig"] = {"enabled": g.mig_enabled, "instances": instances}
    if g.simulated:
        out["simulated"] = True
    return out


def read_error_json(error: ReadError) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": error.kind, "status": error.status, "message": error.message}
    if error.at is not None:
        out["at"] = utc_iso(error.at)
    return out


def heartbeat_json(note: HeartbeatNote) -> dict[str, Any]:
    """The `heartbeat` key of the stored report."""
    out: dict[str, Any] = {"ok": note.ok, "checkedAt": _iso(note.checked_at)}
    if not note.ok:
        out["error"] = read_error_json(note.error) if note.error is not None else None
        out["failingSince"] = _iso(note.failing_since)
    return out


def _iso(moment: datetime | None) -> str | None:
    return utc_iso(moment) if moment is not None else None


# -- the one reader ----------------------------------------------------------------------------


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _maps(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    """A non-empty string, else unknown."""
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    # The wire's one integer rule (a whole number is an integer): what the contract let in
    # arrives as an int already; a row stored before that reads the same.
    return whole_int(value)


def _amount(value: Any, *, positive: bool = False) -> float | None:
    """A MiB figure: a number (never a boolean), at least 0 (above 0 for a total)."""
    if not is_number(value) or value < 0 or (positive and value == 0):
        return None
    return float(value)


def _time(value: Any) -> datetime | None:
    """Accept an ISO 8601 string (a trailing Z included) or epoch seconds."""
    if is_number(value):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def engine_version(value: Any) -> str | None:
    """Keep a reported engine version as the columns hold it ("" reads as not reported): a
    longer one (any supervisor may send one) is cut, never a failed database write."""
    return (_text(value) or "")[:ENGINE_VERSION_MAX] or None


def read_model(m: Mapping[str, Any]) -> ModelReport | None:
    name = _text(m.get("name"))
    if name is None:
        return None
    sleeping = m.get("sleeping")
    return ModelReport(
        name=name,
        sleeping=sleeping if isinstance(sleeping, bool) else None,
        error=_text(m.get("error")),
        draining=m.get("draining") is True,
        engine_version=engine_version(m.get("engineVersion")),
        fingerprint=_text(m.get("fingerprint")),
        # Stored as `pid`; the wire (and rows stored before) carry it as `process.pid`.
        pid=_int(m.get("pid")) or _int(_map(m.get("process")).get("pid")),
    )


def stop_answer_trainers(body: object) -> dict[int, TrainingReport]:
    """The trainers a `POST /v1/training/stop` answer lists, by GPU index: ours lists every
    training slot's state after the stop (docs/wire.md), the original's lists none (empty)."""
    out: dict[int, TrainingReport] = {}
    for entry in _maps(body.get("slots") if isinstance(body, Mapping) else None):
        gpu = _int(entry.get("gpuIndex"))
        if gpu is not None and gpu >= 0:
            out.setdefault(gpu, read_training(entry))
    return out


def read_training(t: Mapping[str, Any]) -> TrainingReport:
    state = t.get("state")
    checkpoint = t.get("lastCheckpointAt")
    if checkpoint is None:
        checkpoint = _map(t.get("checkpoint")).get("at")
    pids = t.get("pids")
    return TrainingReport(
        state=state if isinstance(state, str) else None,
        pids=tuple(p for p in (_int(x) for x in pids) if p is not None)
        if isinstance(pids, list)
        else (),
        checkpoint_at=_time(checkpoint),
        last_error=_text(t.get("lastError")),
        adapter_at=_time(t.get("lastAdapterAt")),
    )


def _read_slot(s: Mapping[str, Any]) -> SlotReport | None:
    gpu, kind = _int(s.get("gpuIndex")), s.get("kind")
    if gpu is None or gpu < 0:
        return None
    training = s.get("training")
    if kind not in (INFERENCE, TRAINING):
        # Rows stored before the form was fixed may leave the kind out: what they hold says.
        kind = TRAINING if isinstance(training, Mapping) else INFERENCE
    return SlotReport(
        gpu_index=gpu,
        kind=kind,
        models=tuple(m for m in map(read_model, _maps(s.get("models"))) if m is not None)
        if kind == INFERENCE
        else (),
        training=read_training(training)
        if kind == TRAINING and isinstance(training, Mapping)
        else None,
    )


def read_status(root: Mapping[str, Any], *, raw: dict[str, Any] | None = None) -> StatusReport:
    """Read a status body's fields (one that passed the contract, or one stored)."""
    ready = root.get("ready")
    features = root.get("features")
    return StatusReport(
        slots=tuple(s for s in map(_read_slot, _maps(root.get("slots"))) if s is not None),
        ready=ready is True,
        features=frozenset(f for f in features if isinstance(f, str))
        if isinstance(features, list)
        else frozenset(),
        plan_mismatches=tuple(
            PlanMismatch(
                code=_text(p.get("code")) or "",
                message=p["message"],
                gpu_index=_int(p.get("gpuIndex")),
            )
            for p in _maps(root.get("planMismatches"))
            if isinstance(p.get("message"), str)
        ),
        raw=raw if raw is not None else {},
    )


def _read_processes(value: Any) -> tuple[GpuProcess, ...]:
    return tuple(
        GpuProcess(pid=pid, used_mib=_amount(p.get("usedMiB")), name=_text(p.get("name")))
        for p in _maps(value)
        if (pid := _int(p.get("pid"))) is not None
    )


def read_gpu(g: Mapping[str, Any]) -> GpuReport | None:
    index = _int(g.get("index"))
    if index is None or index < 0:
        return None
    mig = _map(g.get("mig"))
    instances = tuple(
        MigInstance(
            gpu_instance_id=_int(i.get("gpuInstanceId")),
            used_mib=_amount(i.get("usedMiB")),
            total_mib=_amount(i.get("totalMiB")),
            processes=_read_processes(i.get("processes")),
        )
        for i in _maps(mig.get("instances"))
    )
    used, total = _amount(g.get("usedMiB")), _amount(g.get("totalMiB"), positive=True)
    if (used is None or total is None) and instances:
        # A MIG card reports memory per instance; the parent sums them.
        used = sum(i.used_mib or 0.0 for i in instances)
        total = sum(i.total_mib or 0.0 for i in instances) or None
    return GpuReport(
        index=index,
        used_mib=used,
        total_mib=total,
        name=_text(g.get("name")),
        processes=_read_processes(g.get("processes")),
        mig_enabled=mig.get("enabled") is True or bool(instances),
        mig=instances,
        simulated=g.get("simulated") is True,
    )


def read_gpus(value: Any) -> tuple[GpuReport, ...]:
    return tuple(g for g in map(read_gpu, _maps(value)) if g is not None)


def read_error(value: Any) -> ReadError | None:
    e = _map(value)
    if not e:
        return None
    return ReadError(
        kind=_text(e.get("kind")) or "unknown",
        message=e["message"] if isinstance(e.get("message"), str) else "",
        status=_int(e.get("status")),
        at=_time(e.get("at")),
    )


def _read_heartbeat(value: Any) -> HeartbeatNote | None:
    h = _map(value)
    if not isinstance(h.get("ok"), bool):
        return None
    return HeartbeatNote(
        ok=h["ok"],
        checked_at=_time(h.get("checkedAt")),
        failing_since=_time(h.get("failingSince")),
        error=read_error(h.get("error")),
    )


def _stored_gpus(report: Mapping[str, Any]) -> Any:
    """The GPU list of a stored report; rows of earlier releases may nest it."""
    for candidate in (
        report.get("gpus"),
        _map(report.get("gpu")).get("gpus"),
        _map(report.get("memory")).get("gpus"),
        _map(report.get("gpuMemory")).get("gpus"),
    ):
        if isinstance(candidate, list):
            return candidate
    return None


def read_report(stored: Any) -> DomainReport:
    """Read a stored report (`Domain.last_report`) into the model; never raises.

    Reads the stored form (`DomainReport.to_json`) and the rows written before it (the status
    body as sent, where the slots may sit under `status`), so `read_report(r.to_json()) == r`.
    """
    report = _map(stored)
    root = report
    if not isinstance(root.get("slots"), list):
        root = _map(report.get("status"))
    status = read_status(root) if isinstance(root.get("slots"), list) else None
    return DomainReport(
        status=status,
        gpus=read_gpus(_stored_gpus(report)),
        gpus_at=_time(report.get("gpusAt")),
        gpus_error=read_error(report.get("gpusError")),
        heartbeat=_read_heartbeat(report.get("heartbeat")),
    )
