"""Turn a domain's GPU description and slots into a placement request, and apply the plan.

Shared by the layout loader (a file) and the services that re-plan a domain from the database
(admin, `supervisor_config`, the dashboard), so both plan the same way. The planner itself is
pure (`fleets.core.placement`); this module only maps layout vocabulary onto it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter

from fleets.core.placement import (
    DEFAULT_SAFETY_MARGIN_MIB,
    DEFAULT_SLEEP_RESIDUE_MIB,
    GpuDevice,
    MigInstance,
    Plan,
    PlanInputError,
    PlanRequest,
    Server,
    ServerGroup,
    Trainer,
    named,
    plan,
)
from fleets.core.states import SlotKind

PLACEMENT_REFUSALS = Counter(
    "haru_placement_refusals_total",
    "Workloads the GPU planner refused while planning a layout, by reason.",
    ["reason"],
)


def count_refusals(reasons: Iterable[str]) -> None:
    for reason in reasons:
        PLACEMENT_REFUSALS.labels(reason=reason).inc()


# Profile keys the plan writes; a layout of a planned domain leaves them to the planner.
PLANNED_PROFILE_KEYS = ("gpus", "gpuMemoryUtilization")
MEMORY_KEYS = ("memoryMiB", "memoryFraction", "exclusive", "sleepResidueMiB")


class SlotLike(Protocol):
    """A slot as the planner reads it: a layout's SlotSpec or a stored Slot."""

    kind: str
    gpu_index: Any
    mig_instance: str
    spec: Any


class ModelLike(Protocol):
    """A model on a slot as the planner reads it: a layout's ModelSpec or a ModelBinding."""

    name: str
    memory: Any
    profile: Any


@dataclass
class UnitInput:
    """One layout slot as the planner sees it."""

    # e.g. "slots[1] (qwen-small, llama-small)"; a few names at most, since every refusal and
    # every "needs memoryMiB" line repeats it (listing 19,000 models made those quadratic).
    label: str
    kind: str
    gpu_index: int | None
    mig: str | None = None
    gpu_type: str | None = None
    topology: str = "prefer"
    # inference: (model name, memory request, profile)
    servers: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    budget_mib: int | None = None

    @classmethod
    def of_slot(cls, label: str, slot: SlotLike, models: Sequence[ModelLike]) -> UnitInput:
        """A slot as written in a layout or as stored, with its models: the slot's spec holds
        the GPU type, the topology and a trainer's memory budget; an empty MIG instance is
        none. `label` names it in a refusal."""
        return cls(
            label=f"{label} ({named([m.name for m in models]) or 'trainer'})",
            kind=slot.kind,
            gpu_index=slot.gpu_index,
            mig=slot.mig_instance or None,
            gpu_type=slot.spec.get("gpuType"),
            topology=slot.spec.get("topology", "prefer"),
            servers=[(m.name, m.memory, m.profile) for m in models],
            budget_mib=slot.spec.get("memoryBudgetMiB"),
        )


def expand_gpus(raw: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Expand `count` entries into one normalized dict per GPU; return (gpus, errors)."""
    out: list[dict[str, Any]] = []
    errors: list[str] = []
    seen: set[int] = set()
    next_index = 0
    for i, entry in enumerate(raw):
        count = entry.get("count", 1)
        start = entry.get("index", next_index)
        if entry.get("mig") and count > 1:
            errors.append(f"gpus[{i}].mig: name MIG instances per GPU (count must be 1)")
        for index in range(start, start + count):
            if index in seen:
                errors.append(f"gpus[{i}]: GPU {index} is described twice")
                continue
            seen.add(index)
            gpu = {"index": index, "type": entry["type"], "memoryMiB": entry["memoryMiB"]}
            for key in ("nvlinkGroup", "numaNode"):
                if key in entry:
                    gpu[key] = entry[key]
            if entry.get("mig"):
                gpu["mig"] = [dict(m) for m in entry["mig"]]
            out.append(gpu)
        next_index = start + count
    return sorted(out, key=lambda g: g["index"]), errors


def devices(gpus: Sequence[dict[str, Any]]) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(
            index=g["index"],
            type=g["type"],
            memory_mib=g["memoryMiB"],
            mig=tuple(MigInstance(m["name"], m["memoryMiB"]) for m in g.get("mig", ())),
            nvlink_group=g.get("nvlinkGroup"),
            numa_node=g.get("numaNode"),
        )
        for g in gpus
    )


def _server(name: str, memory: dict[str, Any], profile: dict[str, Any]) -> Server:
    fraction = memory.get("memoryFraction")
    if memory.get("memoryMiB") is None and fraction is None:
        # An operator who already wrote a vLLM fraction into the profile meant it as the need.
        fraction = profile.get("gpuMemoryUtilization")
    return Server(
        name=name,
        memory_mib=memory.get("memoryMiB"),
        memory_fraction=fraction,
        exclusive=bool(memory.get("exclusive", False)),
        tensor_parallel=int(profile.get("tensorParallel", 1) or 1),
        sleep_residue_mib=memory.get("sleepResidueMiB", DEFAULT_SLEEP_RESIDUE_MIB),
    )


def missing_need(units: Sequence[UnitInput]) -> list[str]:
    """Name the shared servers that give no memory need (they cannot be packed)."""
    out = []
    for u in units:
        if u.kind != SlotKind.INFERENCE:
            continue
        for name, memory, profile in u.servers:
            s = _server(name, memory, profile)
            if not s.whole_gpus and s.memory_mib is None and s.memory_fraction is None:
                out.append(
                    f"{u.label}: model {name!r} needs memoryMiB or memoryFraction "
                    "(or exclusive: true) to be planned"
                )
    return out


def plan_units(
    gpus: Sequence[dict[str, Any]],
    units: Sequence[UnitInput],
    *,
    policy: str = "binpack",
    safety_margin_mib: int = DEFAULT_SAFETY_MARGIN_MIB,
) -> Plan:
    """Plan the units on the GPUs; raise PlanInputError for a malformed request."""
    groups, trainers = [], []
    for u in units:
        if u.kind == SlotKind.INFERENCE:
            groups.append(
                ServerGroup(
                    name=u.label,
                    servers=tuple(_server(*s) for s in u.servers),
                    gpu_type=u.gpu_type,
                    gpu_index=u.gpu_index,
                    mig=u.mig,
                    topology=u.topology,  # type: ignore[arg-type]
                )
            )
        else:
            trainers.append(
                Trainer(u.label, u.budget_mib, u.gpu_type, gpu_index=u.gpu_index, mig=u.mig)
            )
    return plan(
        PlanRequest(
            gpus=devices(gpus),
            groups=tuple(groups),
            trainers=tuple(trainers),
            policy=policy,  # type: ignore[arg-type]
            safety_margin_mib=safety_margin_mib,
        )
    )


@dataclass(frozen=True)
class Placed:
    """Where one unit landed and what it was granted."""

    gpu_indices: tuple[int, ...]
    mig: str | None
    allocation: dict[str, Any]


def placements(result: Plan) -> dict[str, Placed]:
    """Map each unit label to its placement and the allocation a slot stores."""
    out: dict[str, Placed] = {}
    for g in result.groups:
        out[g.name] = Placed(
            g.gpu_indices,
            g.mig,
            {
                "servers": {
                    s.name: {
                        "needMiB": s.need_mib,
                        "gpuMemoryUtilization": s.gpu_memory_utilization,
                        "sleepResidueMiB": s.sleep_residue_mib,
                    }
                    for s in g.servers
                }
            },
        )
    for t in result.trainers:
        out[t.name] = Placed((t.gpu_index,), t.mig, {"budgetMiB": t.budget_mib})
    return out


def planned_profile(profile: dict[str, Any], gpu_indices: Sequence[int], util: float) -> dict:
    """Return a managed server's profile with the plan's GPUs and memory fraction in it."""
    if not profile:
        return profile  # unmanaged: the operator starts it, with the flag the plan shows
    return {**profile, "gpus": list(gpu_indices), "gpuMemoryUtilization": util}


__all__ = [
    "MEMORY_KEYS",
    "PLACEMENT_REFUSALS",
    "count_refusals",
    "PLANNED_PROFILE_KEYS",
    "Placed",
    "PlanInputError",
    "UnitInput",
    "devices",
    "expand_gpus",
    "missing_need",
    "placements",
    "plan_units",
    "planned_profile",
]
