"""Per GPU: what the plan allocated to each workload, next to what the last report measured.

The plan lives on the slots (`Slot.allocation`): each server's awake share and sleeping
residue, each trainer's budget. The measurement is the supervisor's last GPU report, tied to a
workload by PID (a model server's PID, a trainer's PIDs). Residue is kept apart from the awake
share, because on a standby it is the memory that stays taken while the trainer runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleets.core.report import DomainReport
from fleets.core.states import SlotKind


@dataclass
class Workload:
    name: str
    kind: str  # "server" or "trainer"
    planned_mib: int  # awake share, or the trainer's budget
    residue_mib: int = 0  # a server's planned share while asleep
    measured_mib: int | None = None  # None: no process of it in the last report
    asleep: bool | None = None


@dataclass
class GpuAllocation:
    index: int
    workloads: list[Workload] = field(default_factory=list)

    @property
    def planned_awake_mib(self) -> int:
        return sum(w.planned_mib for w in self.workloads if w.kind == "server")

    @property
    def planned_residue_mib(self) -> int:
        return sum(w.residue_mib for w in self.workloads if w.kind == "server")

    @property
    def planned_trainer_mib(self) -> int:
        return sum(w.planned_mib for w in self.workloads if w.kind == "trainer")

    @property
    def sharing(self) -> int:
        return len(self.workloads)


def _usage_by_pid(report: DomainReport) -> dict[tuple[int, int], int]:
    """(GPU index, PID) -> MiB, from the processes the report lists."""
    out: dict[tuple[int, int], int] = {}
    for gpu in report.gpus:
        for p in gpu.all_processes:
            if p.used_mib is not None:
                key = (gpu.index, p.pid)
                out[key] = out.get(key, 0) + round(p.used_mib)
    return out


def gpu_allocations(
    slots: Iterable[Any], bindings: Iterable[Any], report: DomainReport
) -> list[GpuAllocation]:
    """Return one allocation per GPU the plan uses (empty when the domain is hand-placed)."""
    usage = _usage_by_pid(report)
    models = report.models()
    training = report.trainings()
    by_slot: dict[Any, list[str]] = {}
    for b in bindings:
        by_slot.setdefault(b.slot_id, []).append(b.name)
    gpus: dict[int, GpuAllocation] = {}
    for slot in slots:
        allocation = slot.allocation or {}
        indices = slot.gpu_indices or [slot.gpu_index]
        for index in indices:
            gpu = gpus.setdefault(index, GpuAllocation(index))
            if slot.kind == SlotKind.TRAINING and "budgetMiB" in allocation:
                seen = training.get(slot.gpu_index)
                pids = list(seen.pids) if seen else []
                measured = [usage[(index, p)] for p in pids if (index, p) in usage]
                gpu.workloads.append(
                    Workload(
                        "trainer",
                        "trainer",
                        allocation["budgetMiB"],
                        measured_mib=sum(measured) if measured else None,
                    )
                )
                continue
            for name, grant in sorted(allocation.get("servers", {}).items()):
                if name not in by_slot.get(slot.id, []):
                    continue
                seen_m = models.get(name)
                pid = seen_m.pid if seen_m else None
                gpu.workloads.append(
                    Workload(
                        name,
                        "server",
                        grant.get("needMiB", 0),
                        residue_mib=grant.get("sleepResidueMiB", 0),
                        measured_mib=usage.get((index, pid)) if pid is not None else None,
                        asleep=seen_m.sleeping if seen_m else None,
                    )
                )
    return [gpus[i] for i in sorted(gpus) if gpus[i].workloads]


def plan_mismatches(report: DomainReport) -> list[str]:
    """The supervisor's start-up comparison of the plan with its real GPUs, as messages."""
    if report.status is None:
        return []
    return [m.message for m in report.status.plan_mismatches]
