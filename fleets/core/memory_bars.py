"""A domain's GPU memory as the dashboard draws it: one bar per GPU, split by who holds it.

Read from the stored report (`fleets.core.report`): memory is tied to a workload by PID (a model
server's PID, a trainer's PIDs), a process the report does not tie to one by its label, and what
no listed process holds is "other".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleets.core.report import DomainReport, GpuProcess
from fleets.core.timestamps import utc_iso

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


def _pid_owners(report: DomainReport) -> dict[int, str]:
    """Map each known PID to the segment kind its memory counts as."""
    owners: dict[int, str] = {}
    for m in report.models().values():
        if m.pid is not None:
            # A model whose sleep state is unknown is drawn as awake: overstating what serves is
            # the safer error than calling live weights "residue".
            owners[m.pid] = SLEEPING if m.sleeping else AWAKE
    for t in report.trainings().values():
        for pid in t.pids:
            owners[pid] = TRAINING
    return owners


def _guess_kind(name: str | None) -> str:
    """Classify a process the report does not tie to a PID by its label (the simulated GPU
    labels its holders), else call it other."""
    text = (name or "").lower()
    if "train" in text:
        return TRAINING
    if "sleep" in text or "residue" in text:
        return SLEEPING
    return OTHER


def _segments(
    processes: Iterable[GpuProcess], used: int, total: int, owners: Mapping[int, str]
) -> list[Segment]:
    sums = {AWAKE: 0, SLEEPING: 0, TRAINING: 0, OTHER: 0}
    for proc in processes:
        if proc.used_mib is None or proc.used_mib <= 0:
            continue
        sums[owners.get(proc.pid) or _guess_kind(proc.name)] += round(proc.used_mib)
    attributed = sum(sums.values())
    # Memory NVML counts but no listed process holds (contexts, other containers).
    if used > attributed:
        sums[OTHER] += used - attributed
    out = []
    for kind in (AWAKE, SLEEPING, TRAINING, OTHER):
        if sums[kind] > 0:
            pct = min(100.0, 100.0 * sums[kind] / total) if total else 0.0
            out.append(Segment(kind, sums[kind], round(pct, 2), SEGMENT_LABELS[kind]))
    return out


def gpu_bars(report: DomainReport, gpu_indices: Iterable[int] = ()) -> list[GpuBar]:
    """Return one memory bar per GPU the report knows, plus an unknown bar for each layout GPU
    the report does not mention."""
    owners = _pid_owners(report)
    bars: dict[int, GpuBar] = {}
    for gpu in report.gpus:
        used = round(gpu.used_mib) if gpu.used_mib is not None else None
        total = round(gpu.total_mib) if gpu.total_mib is not None else None
        bar = GpuBar(
            index=gpu.index,
            name=gpu.name or "",
            used_mib=used,
            total_mib=total,
            used_pct=(
                round(min(100.0, 100.0 * used / total), 1) if used is not None and total else None
            ),
            mig=gpu.mig_enabled,
            simulated=gpu.simulated,
        )
        if used is not None and total:
            bar.segments = _segments(gpu.all_processes, used, total, owners)
        else:
            bar.error = "memory not reported"
        bars[gpu.index] = bar
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


def report_error(report: DomainReport) -> str | None:
    """Return the reconciler's note on why the last heartbeat failed, if it left one."""
    note = report.heartbeat
    if note is None or note.ok:
        return None
    message = (note.error.message if note.error is not None else "") or "failed"
    since = note.failing_since
    return f"{message} (failing since {utc_iso(since)})" if since is not None else message
