"""Place model servers and trainers on a host's GPUs, HAMi style: filter, score, explain.

Each GPU either fits the request or is refused with one reason named as HAMi names it, so an
operator reading a refusal sees the same vocabulary as in HAMi's scheduler events. Fitting GPUs
are scored ((cores + used cores) / 100 + (memory + used memory) / total) x 10; binpack takes the
highest score (fill busy cards, keep whole cards free for large models), spread the lowest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_MEM_MIB = 5000  # HAMi's defaultMem, used when a request names no memory
DEFAULT_SPLIT_COUNT = 10  # HAMi's deviceSplitCount: tasks that may time-slice one card
EXCLUSIVE_CORES = 100

PlacementPolicy = Literal["binpack", "spread"]

NOT_HEALTHY = "CardNotHealth"
TYPE_MISMATCH = "CardTypeMismatch"
UUID_MISMATCH = "CardUuidMismatch"
TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
EXCLUSIVE_CONFLICT = "ExclusiveDeviceAllocateConflict"
INSUFFICIENT_MEMORY = "CardInsufficientMemory"
INSUFFICIENT_CORE = "CardInsufficientCore"
COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
NUMA_NOT_FIT = "NumaNotFit"
CARDS_INSUFFICIENT = "AllocatedCardsInsufficientRequest"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"


@dataclass(frozen=True)
class Gpu:
    """One physical GPU and what is already placed on it."""

    index: int
    total_mib: int
    allocated_mib: int = 0  # granted to tasks Haru placed
    used_mib: int = 0  # observed through NVML, including memory nobody was granted
    type: str = ""
    uuid: str = ""
    numa: int = 0
    healthy: bool = True
    tasks: int = 0
    cores_used: int = 0  # 0..100, summed over the tasks
    split_count: int = DEFAULT_SPLIT_COUNT

    def __post_init__(self) -> None:
        if self.total_mib <= 0:
            raise ValueError(f"GPU {self.index}: total_mib must be positive")

    @property
    def committed_mib(self) -> int:
        # HAMi counts granted memory; NVML can see more (a sleeping vLLM's CUDA context, a
        # process started by hand), and that memory is just as unavailable.
        return max(self.allocated_mib, self.used_mib)


@dataclass(frozen=True)
class GpuRequest:
    """What one workload asks for; cores 100 means the card exclusively."""

    mem_mib: int | None = None
    mem_percent: int | None = None
    cores: int = 0
    count: int = 1
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False

    def __post_init__(self) -> None:
        if self.mem_mib is not None and self.mem_percent is not None:
            raise ValueError("give mem_mib or mem_percent, not both")
        if self.mem_mib is not None and self.mem_mib <= 0:
            raise ValueError("mem_mib must be positive")
        if self.mem_percent is not None and not 1 <= self.mem_percent <= 100:
            raise ValueError("mem_percent must be between 1 and 100")
        if not 0 <= self.cores <= EXCLUSIVE_CORES:
            raise ValueError("cores must be between 0 and 100")
        if self.count < 1:
            raise ValueError("count must be at least 1")

    def mem_for(self, gpu: Gpu) -> int:
        """Return the MiB this request needs on `gpu`."""
        if self.mem_percent is not None:
            return gpu.total_mib * self.mem_percent // 100
        return self.mem_mib if self.mem_mib is not None else DEFAULT_MEM_MIB


@dataclass(frozen=True)
class GpuRefusal:
    index: int
    reason: str
    detail: str


@dataclass(frozen=True)
class Placement:
    """The chosen GPUs (best first), each fitting GPU's score, and the MiB granted per choice."""

    gpu_indices: tuple[int, ...]
    scores: dict[int, float]
    mem_mib: dict[int, int]


class PlacementRefused(Exception):
    """No set of GPUs fits; `reasons` explains every GPU, `code` sums up the host."""

    def __init__(self, code: str, reasons: tuple[GpuRefusal, ...], request: GpuRequest) -> None:
        counts = ", ".join(f"{n}x {r}" for r, n in Counter(x.reason for x in reasons).items())
        super().__init__(
            f"{code}: no {request.count} GPU(s) fit ({counts or 'no GPUs'}); "
            + "; ".join(f"GPU {x.index}: {x.detail}" for x in reasons)
        )
        self.code = code
        self.reasons = reasons


def _refusal(gpu: Gpu, req: GpuRequest) -> tuple[str, str] | None:
    """Return (reason, detail) when `gpu` cannot take `req` on its own, else None."""
    kind = gpu.type.lower()
    mem = req.mem_for(gpu)
    free = gpu.total_mib - gpu.committed_mib
    checks = (
        (not gpu.healthy, NOT_HEALTHY, "reported unhealthy"),
        (
            (req.use_types and not any(t.lower() in kind for t in req.use_types))
            or any(t.lower() in kind for t in req.nouse_types),
            TYPE_MISMATCH,
            f"type {gpu.type!r} is not allowed",
        ),
        (
            (req.use_uuids and gpu.uuid not in req.use_uuids) or gpu.uuid in req.nouse_uuids,
            UUID_MISMATCH,
            f"uuid {gpu.uuid!r} is not allowed",
        ),
        (
            gpu.tasks >= gpu.split_count,
            TIME_SLICING_EXHAUSTED,
            f"already shared by {gpu.tasks} of {gpu.split_count} tasks",
        ),
        (
            req.cores == EXCLUSIVE_CORES and gpu.tasks > 0,
            EXCLUSIVE_CONFLICT,
            f"exclusive use asked but {gpu.tasks} task(s) already run here",
        ),
        (mem > free, INSUFFICIENT_MEMORY, f"needs {mem} MiB, {free} of {gpu.total_mib} free"),
        (
            req.cores > EXCLUSIVE_CORES - gpu.cores_used,
            INSUFFICIENT_CORE,
            f"needs {req.cores}% cores, {EXCLUSIVE_CORES - gpu.cores_used}% free",
        ),
        (
            # A zero-core task would still launch kernels on a card someone holds whole.
            req.cores == 0 and gpu.cores_used >= EXCLUSIVE_CORES,
            COMPUTE_UNITS_EXHAUSTED,
            "all cores are taken",
        ),
    )
    return next(((reason, detail) for failed, reason, detail in checks if failed), None)


def _score(gpu: Gpu, req: GpuRequest) -> float:
    cores = (req.cores + gpu.cores_used) / EXCLUSIVE_CORES
    mem = (req.mem_for(gpu) + gpu.committed_mib) / gpu.total_mib
    return round((cores + mem) * 10, 6)  # rounded so float noise never decides a tie


def _order(gpus: list[Gpu], scores: dict[int, float], policy: PlacementPolicy) -> list[Gpu]:
    # Score first; NUMA node as the tiebreak (binpack descending, spread ascending); index last.
    sign = -1 if policy == "binpack" else 1
    return sorted(gpus, key=lambda g: (sign * scores[g.index], sign * g.numa, g.index))


def place(
    gpus: Sequence[Gpu], request: GpuRequest, *, policy: PlacementPolicy = "binpack"
) -> Placement:
    """Choose `request.count` GPUs for a workload, or raise PlacementRefused explaining why not."""
    if policy not in ("binpack", "spread"):
        raise ValueError(f"unknown placement policy {policy!r}")
    if len({g.index for g in gpus}) != len(gpus):
        raise ValueError("GPU indices must be unique")
    refusals: list[GpuRefusal] = []
    fitting: list[Gpu] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        refused = _refusal(gpu, request)
        if refused:
            refusals.append(GpuRefusal(gpu.index, *refused))
        else:
            fitting.append(gpu)
    scores = {g.index: _score(g, request) for g in fitting}

    if request.numa_bind:
        groups: dict[int, list[Gpu]] = {}
        for gpu in fitting:
            groups.setdefault(gpu.numa, []).append(gpu)
        options = [
            _order(members, scores, policy)[: request.count]
            for members in groups.values()
            if len(members) >= request.count
        ]
        sign = -1 if policy == "binpack" else 1
        options.sort(key=lambda opt: (sign * sum(scores[g.index] for g in opt), sign * opt[0].numa))
        chosen = options[0] if options else []
        short = NUMA_NOT_FIT, "NUMA node {numa} has {n} fitting GPU(s), {count} needed on one node"
    else:
        chosen = _order(fitting, scores, policy)[: request.count]
        short = CARDS_INSUFFICIENT, "fits, but only {total} GPU(s) fit, {count} needed"

    if len(chosen) < request.count:
        reason, template = short
        for gpu in fitting:
            n = sum(1 for g in fitting if g.numa == gpu.numa)
            detail = template.format(numa=gpu.numa, n=n, total=len(fitting), count=request.count)
            refusals.append(GpuRefusal(gpu.index, reason, detail))
        refusals.sort(key=lambda r: r.index)
        if request.count > len(gpus):
            code = NODE_INSUFFICIENT_DEVICE  # the host could never satisfy it, whatever the load
        else:
            code = Counter(r.reason for r in refusals).most_common(1)[0][0]
        raise PlacementRefused(code, tuple(refusals), request)
    return Placement(
        gpu_indices=tuple(g.index for g in chosen),
        scores=scores,
        mem_mib={g.index: request.mem_for(g) for g in chosen},
    )
