"""Compare the GPUs a plan assumed with what the host's GPUs report.

The control plane plans memory from a layout's GPU description; if the host has a different
card, or less memory than the plan assumed, every budget derived from it is wrong. Each
mismatch is one `{gpuIndex, code, message}` entry for `/v1/status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from supervisor.config import PlannedGpu
from supervisor.gpu.facts import GpuFacts

# Real cards report a little less than their marketing size (an H100 80GB reports 81559 MiB);
# a plan written with the round figure must not read as a mismatch.
MEMORY_TOLERANCE = 0.01


def plan_mismatches(
    planned: Sequence[PlannedGpu], facts: Mapping[int, GpuFacts]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for gpu in planned:
        real = facts.get(gpu.index)
        if real is None:
            known = ", ".join(str(i) for i in sorted(facts)) or "none"
            out.append(
                {
                    "gpuIndex": gpu.index,
                    "code": "gpu_missing",
                    "message": f"GPU {gpu.index} is planned but not present (GPUs: {known})",
                }
            )
            continue
        if real.name is not None and gpu.type.lower() not in real.name.lower():
            out.append(
                {
                    "gpuIndex": gpu.index,
                    "code": "gpu_type_mismatch",
                    "message": f"GPU {gpu.index} is planned as {gpu.type!r}, the host has "
                    f"{real.name!r}",
                }
            )
        if real.total_mib < gpu.memory_mib * (1 - MEMORY_TOLERANCE):
            out.append(
                {
                    "gpuIndex": gpu.index,
                    "code": "gpu_memory_mismatch",
                    "message": f"GPU {gpu.index} is planned with {gpu.memory_mib} MiB, the host "
                    f"has {real.total_mib} MiB",
                }
            )
    return out
