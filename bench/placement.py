"""Benchmark the GPU planner on a large domain: how long one plan takes, and what it packs.

    .venv/bin/python bench/placement.py [--gpus 64] [--groups 200] [--trainers 32] [-n 20]

Builds a domain of identical 80 GB GPUs (NVLink groups of 8, NUMA nodes of 32), small server
groups of 4 to 8 GiB, four tensor-parallel-4 servers and trainers without a budget, then plans
it with each policy. Prints the median time per plan and the shape (GPUs used, refusals).
Layouts are planned when they are applied, never on the request path: the figure says how long
`seed_layout` or an admin save waits for the planner.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleets.core.placement import (  # noqa: E402
    GpuDevice,
    PlanRequest,
    Server,
    ServerGroup,
    Trainer,
    plan,
)


def request(gpus: int, groups: int, trainers: int, policy: str) -> PlanRequest:
    devices = tuple(
        GpuDevice(i, "H100", 81559, nvlink_group=i // 8, numa_node=i // 32) for i in range(gpus)
    )
    small = tuple(
        ServerGroup(f"g{i}", (Server(f"s{i}", memory_mib=4096 + 512 * (i % 9)),))
        for i in range(groups)
    )
    wide = tuple(ServerGroup(f"tp{i}", (Server(f"tp{i}", tensor_parallel=4),)) for i in range(4))
    return PlanRequest(
        gpus=devices,
        groups=small + wide,
        trainers=tuple(Trainer(f"t{i}") for i in range(trainers)),
        policy=policy,  # type: ignore[arg-type]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--trainers", type=int, default=32)
    parser.add_argument("-n", type=int, default=20, help="plans per policy")
    args = parser.parse_args()
    for policy in ("binpack", "spread"):
        req = request(args.gpus, args.groups, args.trainers, policy)
        times = []
        for _ in range(args.n):
            started = time.perf_counter()
            result = plan(req)
            times.append(time.perf_counter() - started)
        used = sum(1 for u in result.usage if u.workloads)
        print(
            f"{policy:8s} {args.gpus} GPUs, {len(req.groups)} server groups, {args.trainers} "
            f"trainers: median {statistics.median(times) * 1000:.1f} ms per plan "
            f"(min {min(times) * 1000:.1f}); {used} GPUs used, {len(result.refusals)} refused"
        )


if __name__ == "__main__":
    main()
