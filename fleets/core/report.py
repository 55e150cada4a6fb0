"""Read a domain's last supervisor report (`Domain.last_report`) into what the dashboard shows.

The report is whatever the reconciler stored from the last heartbeat: the `/v1/status` body, and
where the supervisor or the reconciler added them, GPU memory facts. Every field is optional and
may be malformed (an older supervisor, a partial outage), so each reader here returns "unknown"
instead of raising: a dashboard that crashes on a bad heartbeat is useless during the incident
that produced it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from common.strict_json import is_int, is_number


class TrainerReportState(StrEnum):
    """A trainer's state as its supervisor reports it (`/v1/status`, `/v1/training/status`);
    any other value reads as unknown."""

    IDLE = "idle"
    RUNNING = "running"
    STOPPING = "stopping"


# Segment kinds of a GPU memory bar, in drawing order.
AWAKE, SLEEPING, TRAINING, OTHER = "awake", "sleeping", "training", "other"
SEGMENT_LABELS = {
    AWAKE: "awake models",
    SLEEPING: "sleeping residue",
    TRAINING: "training",
    OTHER: "other / unattributed",
}


@dataclass
class Segment:
    kind: str
    mib: int
    pct: float
    label: str


@dataclass
class GpuBar:
    index: int
    name: str
    used_mib: int | None
    total_mib: int | None
    used_pct: float | None
    segments: list[Segment] = field(default_factory=list)
    mig: bool = False
    simulated: bool = False
    error: str = ""


@dataclass
class ReportedModel:
    name: str
    sleeping: bool | None  # None: the supervisor could not tell
    fingerprint: str | None
    pid: int | None
    error: str | None


@dataclass
class ReportedTraining:
    gpu_index: int
    state: str | None
    pids: list[int]
    checkpoint_at: datetime | None
    last_error: str | None


def _as_int(value: Any) -> int | None:
    if is_int(value):
        return value
    # A whole float is read as its integer on purpose: the reconciler's wire-contract check
    # (plain jsonschema) accepted it as one, and this display reader never refuses what the
    # control plane took in; a strict reading would show "unknown" for a value it stored.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _parse_time(value: Any) -> datetime | None:
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


def report_gpus(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the GPU entries of a report, wherever the reconciler nested them."""
    report = _as_map(report)
    for candidate in (
        report.get("gpus"),
        _as_map(report.get("gpu")).get("gpus"),
        _as_map(report.get("memory")).get("gpus"),
        _as_map(report.get("gpuMemory")).get("gpus"),
    ):
        if isinstance(candidate, list):
            return [g for g in candidate if isinstance(g, Mapping)]
    return []


def report_slots(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the `/v1/status` slot entries of a report (nested under `status` or not)."""
    report = _as_map(report)
    slots = report.get("slots")
    if not isinstance(slots, list):
        slots = _as_map(report.get("status")).get("slots")
    return [s for s in _as_list(slots) if isinstance(s, Mapping)]


def _model_pid(model: Mapping[str, Any]) -> int | None:
    process = _as_map(model.get("process"))
    return _as_int(model.get("pid")) or _as_int(process.get("pid"))


def reported_models(report: Mapping[str, Any]) -> dict[str, ReportedModel]:
    """Return what the supervisor said about each model server, by model name."""
    out: dict[str, ReportedModel] = {}
    for slot in report_slots(report):
        for m in _as_list(slot.get("models")):
            if not isinstance(m, Mapping) or not isinstance(m.get("name"), str):
                continue
            sleeping = m.get("sleeping")
            fp = m.get("fingerprint")
            error = m.get("error")
            out[m["name"]] = ReportedModel(
                name=m["name"],
                sleeping=sleeping if isinstance(sleeping, bool) else None,
                fingerprint=fp if isinstance(fp, str) and fp else None,
                pid=_model_pid(m),
                error=error if isinstance(error, str) and error else None,
            )
    return out


def reported_training(report: Mapping[str, Any]) -> dict[int, ReportedTraining]:
    """Return what the supervisor said about each training slot, by GPU index."""
    out: dict[int, ReportedTraining] = {}
    for slot in report_slots(report):
        gpu = _as_int(slot.get("gpuIndex"))
        training = slot.get("training")
        if gpu is None or not isinstance(training, Mapping):
            continue
        pids = [p for p in (_as_int(x) for x in _as_list(training.get("pids"))) if p is not None]
        checkpoint = training.get("lastCheckpointAt")
        if checkpoint is None:
            checkpoint = _as_map(training.get("checkpoint")).get("at")
        state = training.get("state")
        error = training.get("lastError")
        out[gpu] = ReportedTraining(
            gpu_index=gpu,
            state=state if isinstance(state, str) else None,
            pids=pids,
            checkpoint_at=_parse_time(checkpoint),
            last_error=error if isinstance(error, str) and error else None,
        )
    return out


def _pid_owners(report: Mapping[str, Any]) -> dict[int, str]:
    """Map each known PID to the segment kind its memory counts as."""
    owners: dict[int, str] = {}
    for m in reported_models(report).values():
        if m.pid is not None:
            # A model whose sleep state is unknown is drawn as awake: overstating what serves is
            # the safer error than calling live weights "residue".
            owners[m.pid] = SLEEPING if m.sleeping else AWAKE
    for t in reported_training(report).values():
        for pid in t.pids:
            owners[pid] = TRAINING
    return owners


def _guess_kind(name: Any) -> str:
    """Classify a process the report does not tie to a PID by its label (the simulated GPU
    labels its holders), else call it other."""
    text = name.lower() if isinstance(name, str) else ""
    if "train" in text:
        return TRAINING
    if "sleep" in text or "residue" in text:
        return SLEEPING
    return OTHER


def _segments(
    gpu: Mapping[str, Any], used: int, total: int, owners: Mapping[int, str]
) -> list[Segment]:
    sums = {AWAKE: 0, SLEEPING: 0, TRAINING: 0, OTHER: 0}
    for proc in _as_list(gpu.get("processes")):
        if not isinstance(proc, Mapping):
            continue
        mib = _as_int(proc.get("usedMiB"))
        if mib is None or mib <= 0:
            continue
        pid = _as_int(proc.get("pid"))
        kind = owners.get(pid) if pid is not None else None
        sums[kind or _guess_kind(proc.get("name"))] += mib
    attributed = sums[AWAKE] + sums[SLEEPING] + sums[TRAINING] + sums[OTHER]
    # Memory NVML counts but no listed process holds (contexts, other containers).
    if used > attributed:
        sums[OTHER] += used - attributed
    out = []
    for kind in (AWAKE, SLEEPING, TRAINING, OTHER):
        if sums[kind] > 0:
            pct = min(100.0, 100.0 * sums[kind] / total) if total else 0.0
            out.append(Segment(kind, sums[kind], round(pct, 2), SEGMENT_LABELS[kind]))
    return out


def gpu_bars(report: Mapping[str, Any], gpu_indices: Iterable[int] = ()) -> list[GpuBar]:
    """Return one memory bar per GPU the report knows, plus an unknown bar for each layout GPU
    the report does not mention."""
    owners = _pid_owners(report)
    bars: dict[int, GpuBar] = {}
    for gpu in report_gpus(report):
        index = _as_int(gpu.get("index"))
        if index is None:
            continue
        used, total = _as_int(gpu.get("usedMiB")), _as_int(gpu.get("totalMiB"))
        mig = _as_map(gpu.get("mig"))
        instances = [i for i in _as_list(mig.get("instances")) if isinstance(i, Mapping)]
        if (used is None or total is None) and instances:
            # A MIG card reports memory per instance; the parent sums them.
            used = sum(_as_int(i.get("usedMiB")) or 0 for i in instances)
            total = sum(_as_int(i.get("totalMiB")) or 0 for i in instances)
        name = gpu.get("name")
        name = name if isinstance(name, str) else ""
        bar = GpuBar(
            index=index,
            name=name,
            used_mib=used,
            total_mib=total,
            used_pct=(
                round(min(100.0, 100.0 * used / total), 1) if used is not None and total else None
            ),
            mig=bool(mig.get("enabled")) or bool(instances),
            simulated=gpu.get("simulated") is True,
        )
        if used is not None and total:
            merged = dict(gpu)
            if instances and not _as_list(gpu.get("processes")):
                merged["processes"] = [p for i in instances for p in _as_list(i.get("processes"))]
            bar.segments = _segments(merged, used, total, owners)
        else:
            bar.error = "memory not reported"
        bars[index] = bar
    for index in gpu_indices:
        if index not in bars:
            bars[index] = GpuBar(
                index=index,
                name="",
                used_mib=None,
                total_mib=None,
                used_pct=None,
                error="no GPU memory in the last report",
            )
    return [bars[i] for i in sorted(bars)]


def report_error(report: Mapping[str, Any]) -> str | None:
    """Return the reconciler's note on why the last heartbeat failed, if it left one."""
    report = _as_map(report)
    heartbeat = _as_map(report.get("heartbeat"))
    if heartbeat.get("ok") is False:
        error = _as_map(heartbeat.get("error"))
        message = error.get("message") if isinstance(error.get("message"), str) else "failed"
        since = heartbeat.get("failingSince")
        return f"{message} (failing since {since})" if isinstance(since, str) else message
    for key in ("error", "heartbeatError", "lastError"):
        value = report.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, Mapping):
            message = value.get("message")
            if isinstance(message, str):
                return message
    return None
