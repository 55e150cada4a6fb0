"""GPU facts for simulated hosts, read from the shared state file."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from supervisor.config import SimGpuConfig
from supervisor.gpu.facts import GpuFacts, GpuProcess
from supervisor.gpu.sim_state import SimGpuState


class SimGpuBackend:
    """Report simulated GPUs: their fixed size, and what live processes registered on them."""

    name = "sim"

    def __init__(self, state: SimGpuState, gpus: Sequence[SimGpuConfig], host: str | None = None):
        self.state = state
        self.gpus = tuple(gpus)
        self.host = host or "local"

    async def read(self) -> list[GpuFacts]:
        return await asyncio.to_thread(self.read_sync)

    def read_sync(self) -> list[GpuFacts]:
        holders = self.state.holders()
        out: list[GpuFacts] = []
        for gpu in self.gpus:
            mine = [h for h in holders if h.gpu_index == gpu.index]
            by_pid: dict[int, GpuProcess] = {}
            for h in mine:
                prev = by_pid.get(h.pid)
                by_pid[h.pid] = GpuProcess(
                    pid=h.pid,
                    used_mib=(prev.used_mib or 0) + h.mib if prev else h.mib,
                    name=h.label if prev is None else f"{prev.name}+{h.label}",
                )
            used = min(sum(h.mib for h in mine), gpu.total_mib)
            out.append(
                GpuFacts(
                    index=gpu.index,
                    used_mib=used,
                    total_mib=gpu.total_mib,
                    name=gpu.name,
                    uuid=gpu.uuid or f"GPU-sim-{self.host}-{gpu.index}",
                    compute_capability=gpu.compute_capability,
                    processes=tuple(by_pid.values()),
                    extra={"simulated": True},
                )
            )
        return out
