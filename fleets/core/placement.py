"""Plan where a domain's model servers and trainers run, and how much memory each may take.

A device-aware scheduler in miniature: filter every target (a whole GPU or one MIG instance),
score the ones that fit by policy, and explain every refusal with the workload, the target and
the reason (with the numbers). Pure and deterministic: the same request gives the same plan.

Memory follows how level-1 sleep really behaves. A target lives in two postures:
- awake (this domain is active): every server holds its full share, no trainer runs;
- standby: every server sleeps but keeps a residue (CUDA context, allocator), and the trainer
  uses what is left.
So a target fits when `shares + margin <= total` and `residues + trainer + margin <= total`,
and the trainer's budget is `total - residues - margin` unless the layout asks for less.

Placement units are servers that must share a target (one inference slot of a layout: a bundle
of small models on one GPU), or one trainer. A unit that is exclusive or tensor parallel takes
whole GPUs; a MIG instance is never split between two units of the same kind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

Policy = Literal["binpack", "spread"]
POLICIES: tuple[str, ...] = ("binpack", "spread")
Topology = Literal["prefer", "nvlink", "numa"]
SortKey = tuple[Any, ...]

# A sleeping level-1 vLLM keeps 1 to 7 GiB per GPU on real models; without a measured figure,
# plan for a middling one so a trainer's budget leaves that headroom.
DEFAULT_SLEEP_RESIDUE_MIB = 3072
DEFAULT_SAFETY_MARGIN_MIB = 1024
MAX_TARGETS = 1024  # bounds the work of one plan
# Bounds the work of one plan: each unpinned workload is weighed against every target, so 20,000
# one-model slots on 1,024 GPUs would take minutes. 1,024 slots on 1,024 GPUs is about 5 s.
MAX_PLAN_PAIRS = 1024 * 1024
# A refusal names at most this many targets or workloads (a GPU may host thousands of slots):
# otherwise every message repeats the whole list and the report grows with its square.
NAMED_AT_MOST = 5

# Refusal reasons (HAMi's filter names in brackets, for operators who know them).
INSUFFICIENT_MEMORY = "insufficient_memory"  # CardInsufficientMemory
EXCLUSIVE_CONFLICT = "exclusive_conflict"  # ExclusiveDeviceAllocateConflict
TYPE_MISMATCH = "gpu_type_mismatch"  # CardTypeMismatch
TOPOLOGY_NOT_SATISFIABLE = "topology_not_satisfiable"  # NumaNotFit / CardMigTopologyInfeasible
MIG_TOO_SMALL = "mig_instance_too_small"
NO_SUCH_GPU = "no_such_gpu"
REASONS = (
    INSUFFICIENT_MEMORY,
    EXCLUSIVE_CONFLICT,
    TYPE_MISMATCH,
    TOPOLOGY_NOT_SATISFIABLE,
    MIG_TOO_SMALL,
    NO_SUCH_GPU,
)


@dataclass(frozen=True)
class MigInstance:
    name: str
    memory_mib: int


@dataclass(frozen=True)
class GpuDevice:
    index: int
    type: str
    memory_mib: int
    mig: tuple[MigInstance, ...] = ()
    nvlink_group: int | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class Server:
    """One model server. `memory_mib` or `memory_fraction` is per GPU; None takes whole GPUs."""

    name: str
    memory_mib: int | None = None
    memory_fraction: float | None = None
    exclusive: bool = False
    tensor_parallel: int = 1
    sleep_residue_mib: int = DEFAULT_SLEEP_RESIDUE_MIB

    @property
    def whole_gpus(self) -> bool:
        return self.exclusive or self.tensor_parallel > 1


@dataclass(frozen=True)
class ServerGroup:
    """Servers placed together (one inference slot), optionally pinned by the layout."""

    name: str
    servers: tuple[Server, ...]
    gpu_type: str | None = None
    gpu_index: int | None = None
    mig: str | None = None
    topology: Topology = "prefer"

    # Cached: read once per target the group is weighed against (a frozen dataclass keeps
    # them in its __dict__, outside its fields, hash and equality).
    @cached_property
    def width(self) -> int:
        return max(s.tensor_parallel for s in self.servers)

    @cached_property
    def whole_gpus(self) -> bool:
        return any(s.whole_gpus for s in self.servers)


@dataclass(frozen=True)
class Trainer:
    """A trainer; `budget_mib` None takes whatever the sleeping servers leave."""

    name: str
    budget_mib: int | None = None
    gpu_type: str | None = None
    gpu_index: int | None = None
    mig: str | None = None


@dataclass(frozen=True)
class PlanRequest:
    gpus: tuple[GpuDevice, ...]
    groups: tuple[ServerGroup, ...] = ()
    trainers: tuple[Trainer, ...] = ()
    policy: Policy = "binpack"
    safety_margin_mib: int = DEFAULT_SAFETY_MARGIN_MIB


@dataclass(frozen=True)
class ServerPlan:
    name: str
    need_mib: int  # per GPU
    gpu_memory_utilization: float  # the vLLM flag, of the target's memory
    sleep_residue_mib: int


@dataclass(frozen=True)
class GroupPlan:
    name: str
    gpu_indices: tuple[int, ...]
    mig: str | None
    servers: tuple[ServerPlan, ...]


@dataclass(frozen=True)
class TrainerPlan:
    name: str
    gpu_index: int
    mig: str | None
    budget_mib: int


@dataclass(frozen=True)
class Refusal:
    workload: str
    target: str  # "GPU 1", "GPU 0 MIG 1g.10gb", or "domain"
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.workload} on {self.target}: {self.reason} ({self.detail})"


@dataclass(frozen=True)
class TargetUsage:
    """What the plan puts on one target, for display and metrics."""

    target: str
    gpu_index: int
    mig: str | None
    total_mib: int
    awake_mib: int
    residue_mib: int
    trainer_mib: int
    workloads: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    groups: tuple[GroupPlan, ...]
    trainers: tuple[TrainerPlan, ...]
    refusals: tuple[Refusal, ...]
    usage: tuple[TargetUsage, ...]
    policy: Policy

    @property
    def ok(self) -> bool:
        return not self.refusals

    def explain(self) -> list[str]:
        return [str(r) for r in self.refusals]


@dataclass
class _Target:
    gpu: GpuDevice
    mig: MigInstance | None
    awake_mib: int = 0
    residue_mib: int = 0
    trainer_mib: int = 0
    exclusive_of: str | None = None  # the group that holds it whole
    groups: list[str] = field(default_factory=list)
    trainer: str | None = None

    @property
    def total_mib(self) -> int:
        return self.mig.memory_mib if self.mig else self.gpu.memory_mib

    @property
    def label(self) -> str:
        return f"GPU {self.gpu.index}" + (f" MIG {self.mig.name}" if self.mig else "")

    @property
    def empty(self) -> bool:
        return not self.groups and self.trainer is None


class PlanInputError(ValueError):
    """The request itself is malformed (duplicate GPUs, impossible numbers)."""


def named(items: Sequence[str], limit: int = NAMED_AT_MOST) -> str:
    """List at most `limit` names, then how many more: `a, b, c and 17 more`."""
    shown = ", ".join(items[:limit])
    rest = len(items) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def _bounded(refusals: list[Refusal]) -> list[Refusal]:
    """One workload's refusals, at most NAMED_AT_MOST targets named and the rest counted: an
    unpinned slot refused by 1,024 GPUs otherwise reports 1,024 lines."""
    if len(refusals) <= NAMED_AT_MOST:
        return refusals
    kept, rest = refusals[:NAMED_AT_MOST], refusals[NAMED_AT_MOST:]
    reasons: dict[str, int] = {}
    for r in rest:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    common = max(reasons, key=lambda k: reasons[k])
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    summary = Refusal(rest[0].workload, f"{len(rest)} more targets", common, counts)
    return [*kept, summary]


def _grant(server: Server, total_mib: int, margin: int) -> tuple[float, int]:
    """Return (vLLM --gpu-memory-utilization, the MiB that fraction grants) on a target.

    vLLM takes a fraction of the device, so the plan accounts what the rounded fraction really
    grants: a need in MiB rounds up (never less than asked), whole GPUs round down (never
    into the margin).
    """
    if server.memory_mib is not None:
        util = math.ceil(server.memory_mib * 1000 / total_mib) / 1000
    elif server.memory_fraction is not None:
        util = math.ceil(round(server.memory_fraction * 1000, 6)) / 1000
    else:
        util = math.floor((total_mib - margin) * 1000 / total_mib) / 1000
    # A need above the target stays above it (and is refused); the flag itself caps at 1.0.
    return min(util, 1.0), math.ceil(round(util * total_mib, 6))


def _residue(server: Server, need_mib: int) -> int:
    return min(server.sleep_residue_mib, need_mib)


def _type_ok(wanted: str | None, gpu: GpuDevice) -> bool:
    return wanted is None or wanted.lower() in gpu.type.lower()


def _check_request(req: PlanRequest) -> None:
    if req.policy not in POLICIES:
        raise PlanInputError(f"unknown placement policy {req.policy!r} (binpack or spread)")
    if len(req.gpus) > MAX_TARGETS:
        raise PlanInputError(f"at most {MAX_TARGETS} GPUs per domain")
    if len({g.index for g in req.gpus}) != len(req.gpus):
        raise PlanInputError("GPU indices must be unique")
    for g in req.gpus:
        if g.memory_mib <= 0 or any(m.memory_mib <= 0 for m in g.mig):
            raise PlanInputError(f"GPU {g.index}: memory must be positive")
        if len({m.name for m in g.mig}) != len(g.mig):
            raise PlanInputError(f"GPU {g.index}: MIG instance names must be unique")
    names = [g.name for g in req.groups] + [t.name for t in req.trainers]
    if len(set(names)) != len(names):
        raise PlanInputError("workload names must be unique")
    pinned = [g.gpu_index for g in req.groups] + [t.gpu_index for t in req.trainers]
    pairs = sum(1 if index is not None else len(req.gpus) for index in pinned)
    if pairs > MAX_PLAN_PAIRS:
        raise PlanInputError(
            f"{len(names)} workloads on {len(req.gpus)} GPUs is too much to plan (each unpinned "
            f"slot is weighed against every GPU: at most {MAX_PLAN_PAIRS} pairs); put models "
            "that share a GPU in one slot, or pin slots with gpuIndex"
        )
    for group in req.groups:
        if not group.servers:
            raise PlanInputError(f"{group.name}: a server group needs at least one server")
        for s in group.servers:
            if s.memory_mib is not None and s.memory_fraction is not None:
                raise PlanInputError(f"{s.name}: give memory in MiB or as a fraction, not both")
            if s.tensor_parallel < 1 or s.sleep_residue_mib < 0:
                raise PlanInputError(f"{s.name}: tensor parallel >= 1 and residue >= 0")
        if group.whole_gpus and len(group.servers) > 1:
            raise PlanInputError(
                f"{group.name}: an exclusive or tensor-parallel server needs a slot of its own"
            )


def plan(req: PlanRequest) -> Plan:
    """Place every server group, then every trainer; refuse what does not fit, with reasons."""
    _check_request(req)
    targets = _targets(req.gpus)
    margin = req.safety_margin_mib
    refusals: list[Refusal] = []
    placed: list[GroupPlan] = []
    # Largest first (first-fit decreasing), pinned before free, so big models find whole GPUs.
    biggest = max((g.memory_mib for g in req.gpus), default=1)

    def weight(g: ServerGroup) -> SortKey:
        need = sum(_grant(s, biggest, margin)[1] for s in g.servers)
        return (g.gpu_index is None, -g.width, not g.whole_gpus, -need, g.name)

    for group in sorted(req.groups, key=weight):
        placed_group = _place_group(group, targets, req.policy, margin, len(req.gpus))
        if isinstance(placed_group, GroupPlan):
            placed.append(placed_group)
        else:
            refusals.extend(placed_group)
    trained: list[TrainerPlan] = []
    for trainer in sorted(req.trainers, key=lambda t: (t.gpu_index is None, t.name)):
        placed_trainer = _place_trainer(trainer, targets, req.policy, margin)
        if isinstance(placed_trainer, TrainerPlan):
            trained.append(placed_trainer)
        else:
            refusals.extend(placed_trainer)
    usage = tuple(
        TargetUsage(
            t.label,
            t.gpu.index,
            t.mig.name if t.mig else None,
            t.total_mib,
            t.awake_mib,
            t.residue_mib,
            t.trainer_mib,
            tuple(t.groups) + ((t.trainer,) if t.trainer else ()),
        )
        for t in targets
    )
    return Plan(
        groups=tuple(sorted(placed, key=lambda p: p.name)),
        trainers=tuple(sorted(trained, key=lambda p: p.name)),
        refusals=tuple(refusals),
        usage=usage,
        policy=req.policy,
    )


def _targets(gpus: Sequence[GpuDevice]) -> list[_Target]:
    out: list[_Target] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.mig:
            out.extend(_Target(gpu, m) for m in gpu.mig)
        else:
            out.append(_Target(gpu, None))
    return out


def _pinned(
    name: str, index: int | None, mig: str | None, targets: list[_Target]
) -> tuple[list[_Target], list[Refusal]]:
    """Narrow the targets to what the layout pinned; refuse a pin that names nothing."""
    if index is None and mig is None:
        return targets, []
    chosen = [
        t
        for t in targets
        if (index is None or t.gpu.index == index)
        and (mig is None or (t.mig is not None and t.mig.name == mig))
    ]
    if chosen:
        return chosen, []
    where = f"GPU {index}" if index is not None else "domain"
    known = named([t.label for t in targets]) or "none"
    what = f"MIG instance {mig!r}" if mig is not None else f"GPU {index}"
    return [], [Refusal(name, where, NO_SUCH_GPU, f"{what} is not in the domain (has {known})")]


class _NeedsOf:
    """A group's per-GPU needs on a target, computed once per target size: a domain has a
    few sizes and up to 1,024 targets, and each need is a rounding per server."""

    def __init__(self, group: ServerGroup, margin: int) -> None:
        self._group, self._margin = group, margin
        self._by_total: dict[int, tuple[int, ...]] = {}

    def __call__(self, t: _Target) -> tuple[int, ...]:
        total = t.total_mib
        needs = self._by_total.get(total)
        if needs is None:
            needs = self._by_total[total] = _needs(self._group, t, self._margin)
        return needs


def _group_refusal(
    group: ServerGroup, t: _Target, margin: int, needs: tuple[int, ...]
) -> tuple[str, str] | None:
    """Return (reason, detail) when `t` cannot take `group` (needing `needs` there), else
    None."""
    if not _type_ok(group.gpu_type, t.gpu):
        return TYPE_MISMATCH, f"wants {group.gpu_type!r}, GPU is {t.gpu.type!r}"
    if t.exclusive_of is not None:
        return EXCLUSIVE_CONFLICT, f"held whole by {t.exclusive_of}"
    if group.whole_gpus and t.groups:
        return EXCLUSIVE_CONFLICT, f"needs the GPU whole, already hosts {named(t.groups)}"
    if t.mig is not None and group.width > 1:
        return TOPOLOGY_NOT_SATISFIABLE, "a MIG instance cannot join a tensor-parallel group"
    if t.mig is not None and t.groups:
        return (
            EXCLUSIVE_CONFLICT,
            f"already hosts {named(t.groups)}; an instance is never split",
        )
    if t.mig is not None and sum(needs) + margin > t.total_mib:
        return MIG_TOO_SMALL, (
            f"needs {sum(needs)} MiB + {margin} MiB margin, instance has {t.total_mib} MiB"
        )
    free = t.total_mib - t.awake_mib - margin
    if sum(needs) > free:
        return INSUFFICIENT_MEMORY, (
            f"needs {sum(needs)} MiB, {max(free, 0)} MiB free of {t.total_mib} MiB "
            f"({t.awake_mib} MiB planned, {margin} MiB margin)"
        )
    return None


def _score(t: _Target, extra_mib: int, policy: Policy) -> SortKey:
    # binpack: the fullest target after placing; spread: the emptiest. Index breaks ties.
    used = (t.awake_mib + extra_mib) / t.total_mib
    return (-used if policy == "binpack" else used, t.gpu.index, t.mig.name if t.mig else "")


def _place_group(
    group: ServerGroup, targets: list[_Target], policy: Policy, margin: int, gpu_count: int
) -> GroupPlan | list[Refusal]:
    candidates, refused = _pinned(group.name, group.gpu_index, group.mig, targets)
    if refused:
        return refused
    if group.width > 1:
        return _place_wide(group, candidates, targets, policy, margin, gpu_count)
    refusals: list[Refusal] = []
    fitting: list[tuple[SortKey, _Target, tuple[int, ...]]] = []
    needs_of = _NeedsOf(group, margin)
    for t in candidates:
        needs = needs_of(t)
        verdict = _group_refusal(group, t, margin, needs)
        if verdict is not None:
            refusals.append(Refusal(group.name, t.label, *verdict))
        else:
            fitting.append((_score(t, sum(needs), policy), t, needs))
    if not fitting:
        return _bounded(refusals)
    _, target, needs = min(fitting, key=lambda f: f[0])
    return _commit(group, [target], needs, margin)


def _place_wide(
    group: ServerGroup,
    candidates: list[_Target],
    targets: list[_Target],
    policy: Policy,
    margin: int,
    gpu_count: int,
) -> GroupPlan | list[Refusal]:
    """Place a tensor-parallel server on `width` whole GPUs, sharing NVLink or NUMA if it can."""
    width = group.width
    if group.gpu_index is not None:
        # Pinned: the group starts at that GPU and takes the next ones by index.
        start = [t.gpu.index for t in targets].index(group.gpu_index)
        candidates = targets[start:]
    refusals: list[Refusal] = []
    free: list[_Target] = []
    needs_of = _NeedsOf(group, margin)
    for t in candidates:
        verdict = _group_refusal(group, t, margin, needs_of(t))
        if verdict is not None:
            refusals.append(Refusal(group.name, t.label, *verdict))
        else:
            free.append(t)
    if group.gpu_index is not None:
        run = free[:width]
        indices = [t.gpu.index for t in run]
        if indices != list(range(group.gpu_index, group.gpu_index + width)):
            return _bounded(refusals) or [
                Refusal(
                    group.name,
                    f"GPU {group.gpu_index}",
                    TOPOLOGY_NOT_SATISFIABLE,
                    f"needs GPUs {group.gpu_index}..{group.gpu_index + width - 1} whole",
                )
            ]
        return _commit(group, run, _needs(group, run[0], margin), margin)
    if gpu_count < width:
        return [
            Refusal(
                group.name,
                "domain",
                TOPOLOGY_NOT_SATISFIABLE,
                f"tensor parallel {width} needs {width} GPUs, the domain has {gpu_count}",
            )
        ]
    options = _wide_options(free, width, group.topology)
    if not options:
        wanted = {"prefer": "", "nvlink": " on one NVLink group", "numa": " on one NUMA node"}
        return [
            *_bounded(refusals),
            Refusal(
                group.name,
                "domain",
                TOPOLOGY_NOT_SATISFIABLE,
                f"needs {width} whole GPUs{wanted[group.topology]}, "
                f"{len(free)} free ({named([t.label for t in free]) or 'none'})",
            ),
        ]
    # Spread and binpack agree for whole GPUs: take the tightest-fitting set, lowest indices.
    chosen = options[0]
    return _commit(group, chosen, _needs(group, chosen[0], margin), margin)


def _needs(group: ServerGroup, t: _Target, margin: int) -> tuple[int, ...]:
    return tuple(_grant(s, t.total_mib, margin)[1] for s in group.servers)


def _wide_options(free: list[_Target], width: int, topology: Topology) -> list[list[_Target]]:
    """Candidate GPU sets best first: one NVLink group, then one NUMA node, then any.

    Every rank of a tensor-parallel server gets the same --gpu-memory-utilization, so a set
    only mixes GPUs of one type and one memory size.
    """
    options: list[tuple[SortKey, list[_Target]]] = []
    kinds: dict[tuple[str, int], list[_Target]] = {}
    for t in free:
        kinds.setdefault((t.gpu.type, t.total_mib), []).append(t)
    for same in kinds.values():
        options.extend(_wide_sets(same, width, topology))
    return [members for _, members in sorted(options, key=lambda o: o[0])]


def _wide_sets(
    free: list[_Target], width: int, topology: Topology
) -> list[tuple[SortKey, list[_Target]]]:
    options: list[tuple[SortKey, list[_Target]]] = []
    for rank, key in ((0, "nvlink_group"), (1, "numa_node")):
        groups: dict[int, list[_Target]] = {}
        for t in free:
            value = getattr(t.gpu, key)
            if value is not None:
                groups.setdefault(value, []).append(t)
        for members in groups.values():
            if len(members) >= width:
                # The smallest group that fits keeps larger ones whole for larger models.
                options.append(((rank, len(members), members[0].gpu.index), members[:width]))
        if topology == "nvlink" and rank == 0:
            break
    if topology == "prefer" and len(free) >= width:
        options.append(((2, len(free), free[0].gpu.index), free[:width]))
    if topology == "numa":
        options = [o for o in options if o[0][0] == 1]
    return options


def _commit(
    group: ServerGroup, chosen: list[_Target], needs: tuple[int, ...], margin: int
) -> GroupPlan:
    servers = []
    for s, need in zip(group.servers, needs, strict=True):
        util = _grant(s, chosen[0].total_mib, margin)[0]
        servers.append(ServerPlan(s.name, need, util, _residue(s, need)))
    for t in chosen:
        t.awake_mib += sum(needs)
        t.residue_mib += sum(p.sleep_residue_mib for p in servers)
        t.groups.append(group.name)
        if group.whole_gpus:
            t.exclusive_of = group.name
    first = chosen[0]
    return GroupPlan(
        group.name,
        tuple(t.gpu.index for t in chosen),
        first.mig.name if first.mig else None,
        tuple(servers),
    )


def _place_trainer(
    trainer: Trainer, targets: list[_Target], policy: Policy, margin: int
) -> TrainerPlan | list[Refusal]:
    candidates, refused = _pinned(trainer.name, trainer.gpu_index, trainer.mig, targets)
    if refused:
        return refused
    refusals: list[Refusal] = []
    fitting: list[tuple[SortKey, _Target, int]] = []
    for t in candidates:
        room = t.total_mib - t.residue_mib - margin
        if not _type_ok(trainer.gpu_type, t.gpu):
            refusals.append(
                Refusal(
                    trainer.name,
                    t.label,
                    TYPE_MISMATCH,
                    f"wants {trainer.gpu_type!r}, GPU is {t.gpu.type!r}",
                )
            )
        elif t.exclusive_of is not None:
            refusals.append(
                Refusal(
                    trainer.name, t.label, EXCLUSIVE_CONFLICT, f"held whole by {t.exclusive_of}"
                )
            )
        elif t.trainer is not None:
            refusals.append(
                Refusal(trainer.name, t.label, EXCLUSIVE_CONFLICT, f"already runs {t.trainer}")
            )
        elif trainer.budget_mib is not None and trainer.budget_mib > room:
            reason = MIG_TOO_SMALL if t.mig is not None else INSUFFICIENT_MEMORY
            refusals.append(
                Refusal(
                    trainer.name,
                    t.label,
                    reason,
                    f"budget {trainer.budget_mib} MiB > {max(room, 0)} MiB: {t.total_mib} MiB "
                    f"total - {t.residue_mib} MiB sleeping residue - {margin} MiB margin",
                )
            )
        elif room <= 0:
            refusals.append(
                Refusal(
                    trainer.name,
                    t.label,
                    INSUFFICIENT_MEMORY,
                    f"no memory left: {t.residue_mib} MiB residue + {margin} MiB margin "
                    f"of {t.total_mib} MiB",
                )
            )
        else:
            budget = room if trainer.budget_mib is None else trainer.budget_mib
            # binpack: next to sleeping servers, in the memory they give back, keeping empty
            # GPUs whole; spread: where the least residue sits.
            residue = t.residue_mib / t.total_mib
            if policy == "binpack":
                key = (not t.groups, -residue, t.gpu.index, t.mig.name if t.mig else "")
            else:
                key = (False, residue, t.gpu.index, t.mig.name if t.mig else "")
            fitting.append((key, t, budget))
    if not fitting:
        return _bounded(refusals)
    _, target, budget = min(fitting, key=lambda f: f[0])
    target.trainer = trainer.name
    target.trainer_mib = budget
    return TrainerPlan(
        trainer.name, target.gpu.index, target.mig.name if target.mig else None, budget
    )
