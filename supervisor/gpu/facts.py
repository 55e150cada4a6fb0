"""What the supervisor reports about a GPU, and the two ways reading it can fail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

MIB = 1024 * 1024


class GpuUnavailable(Exception):
    """This host cannot read GPU facts at all (no NVML library, no driver): a 501."""


class GpuQueryFailed(Exception):
    """NVML is there but a query failed (GPU lost, permissions): a 502."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "usedMiB": self.used_mib, "name": self.name}


@dataclass(frozen=True)
class MigInstance:
    """One MIG partition: memory is accounted per instance, not per parent GPU."""

    gpu_instance_id: int | None
    compute_instance_id: int | None
    uuid: str | None
    used_mib: int
    total_mib: int
    processes: tuple[GpuProcess, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuInstanceId": self.gpu_instance_id,
            "computeInstanceId": self.compute_instance_id,
            "uuid": self.uuid,
            "usedMiB": self.used_mib,
            "totalMiB": self.total_mib,
            "processes": [p.to_json() for p in self.processes],
        }


@dataclass(frozen=True)
class GpuFacts:
    index: int
    used_mib: int
    total_mib: int
    name: str | None = None
    uuid: str | None = None
    compute_capability: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    # None when the GPU is not partitioned; otherwise its instances.
    mig: tuple[MigInstance, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "usedMiB": self.used_mib,
            "totalMiB": self.total_mib,
            "name": self.name,
            "uuid": self.uuid,
            "computeCapability": self.compute_capability,
            "processes": [p.to_json() for p in self.processes],
            "mig": (
                None
                if self.mig is None
                else {"enabled": True, "instances": [m.to_json() for m in self.mig]}
            ),
            **self.extra,
        }


class GpuBackend(Protocol):
    """Read every GPU's facts; raise GpuUnavailable or GpuQueryFailed."""

    name: str

    def read_sync(self) -> list[GpuFacts]: ...

    async def read(self) -> list[GpuFacts]: ...
