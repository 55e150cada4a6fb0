"""What the supervisor reports about a GPU, and the two ways reading it can fail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from common.wire.codec import Wire, WireRecord, encode

MIB = 1024 * 1024


class GpuUnavailable(Exception):
    """This host cannot read GPU facts at all (no NVML library, no driver): a 501."""


class GpuQueryFailed(Exception):
    """NVML is there but a query failed (GPU lost, permissions): a 502."""


# The wire says MiB where camelCase would say Mib.
UsedMiB = Annotated[int, Wire("usedMiB")]
TotalMiB = Annotated[int, Wire("totalMiB")]


@dataclass(frozen=True)
class GpuProcess(WireRecord):
    pid: int
    used_mib: Annotated[int | None, Wire("usedMiB")]
    name: str | None = None


@dataclass(frozen=True)
class MigInstance(WireRecord):
    """One MIG partition: memory is accounted per instance, not per parent GPU."""

    gpu_instance_id: int | None
    compute_instance_id: int | None
    uuid: str | None
    used_mib: UsedMiB
    total_mib: TotalMiB
    processes: tuple[GpuProcess, ...] = ()


def _mig_json(mig: tuple[MigInstance, ...] | None) -> dict[str, Any] | None:
    return None if mig is None else {"enabled": True, "instances": encode(mig)}


@dataclass(frozen=True)
class GpuFacts(WireRecord):
    index: int
    used_mib: UsedMiB
    total_mib: TotalMiB
    name: str | None = None
    uuid: str | None = None
    compute_capability: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    # None when the GPU is not partitioned; otherwise its instances.
    mig: Annotated[tuple[MigInstance, ...] | None, Wire(encode=_mig_json)] = None
    # Whatever else a backend reports, beside the fields above.
    extra: Annotated[dict[str, Any], Wire(flatten=True)] = field(default_factory=dict)


class GpuBackend(Protocol):
    """Read every GPU's facts; raise GpuUnavailable or GpuQueryFailed."""

    name: str

    def read_sync(self) -> list[GpuFacts]: ...

    async def read(self) -> list[GpuFacts]: ...
