"""The GPU truth's GPU-only code, without a GPU: NVML readings and the targets' verdicts.

A CPU dry run judges nothing and reads no NVML, so these paths would first run on a lent GPU;
here they run against a scripted NVML and hand-made figures.
"""

from __future__ import annotations

from pathlib import Path

from bench.gpu_truth import MemoryReader, stage
from bench.gpu_truth_procs import Plan
from bench.gpu_truth_report import judge, render_table
from supervisor.gpu.facts import MIB
from supervisor.gpu.nvml import NvmlBackend
from tests.supervisor.fakes import FakeGpu, FakeNvml

GIB = 1024 * MIB


def plan(tmp_path: Path, device: str = "cuda") -> Plan:
    return Plan(
        device=device,
        gpu_index=1,
        sizes_mib=[8192],
        kv_cache_mib=2048,
        level2_mib=2048,
        bandwidth_mib=4096,
        trainer_memory_mib=8192,
        grace_ms=5000,
        out=tmp_path,
        python="python3",
        workdir=tmp_path,
    )


def test_the_reader_takes_the_named_gpus_device_memory_from_the_supervisors_nvml(tmp_path):
    nvml = FakeNvml(
        [
            FakeGpu("NVIDIA H200", "GPU-0", 143771, 100),
            FakeGpu("NVIDIA H200", "GPU-1", 143771, 9000),
        ]
    )
    reader = MemoryReader(plan(tmp_path), NvmlBackend(load=lambda: nvml))
    assert reader.used_bytes() == 9000 * MIB
    assert reader.gpu()["name"] == "NVIDIA H200" and reader.gpu()["source"] == "nvml"
    nvml.gpus[1].used_mib = 500
    assert reader.wait_until(lambda used: used < 1000 * MIB, timeout=1) is not None


def test_a_stage_compares_the_change_in_nvml_with_the_change_in_torch(tmp_path):
    nvml = FakeNvml([FakeGpu("x", "0", 1000, 0), FakeGpu("x", "1", 143771, 10_600)])
    reader = MemoryReader(plan(tmp_path), NvmlBackend(load=lambda: nvml))
    before = {"used": 600 * MIB, "torch": 0}
    row = stage("engine load", reader, before, 10 * GIB, judged=False)
    assert row["nvmlDeltaBytes"] == 10_000 * MIB and row["torchDeltaBytes"] == 10 * GIB
    nvml.gpus[1].used_mib = 600
    row = stage("level-1 sleep", reader, before, 0, judged=True)
    assert row["nvmlDeltaBytes"] == -10_000 * MIB and row["torchDeltaBytes"] == -10 * GIB


def gpu_results(**changes) -> dict:
    results = {
        "device": "cuda",
        "gpu": {"name": "NVIDIA H200", "source": "nvml"},
        "bandwidth": {
            "pinnedH2DBytesPerS": 50e9,
            "pageableH2DBytesPerS": 20e9,
            "pinnedD2HBytesPerS": 45e9,
        },
        "engines": [
            {
                "weightsMiB": 8192,
                "level": 1,
                "sleepS": 1.2,
                "wakeWeightsS": 0.2,
                "wakeBytesPerS": 43e9,
                "wakeFractionOfPinned": 0.86,
                "residueWhileAsleepBytes": 520 * MIB,
                "bitExact": True,
                "stages": [
                    {
                        "stage": "engine load",
                        "nvmlDeltaBytes": 11 * GIB,
                        "torchDeltaBytes": 10 * GIB,
                    },
                    {
                        "stage": "level-1 sleep",
                        "judged": True,
                        "nvmlDeltaBytes": -10 * GIB,
                        "torchDeltaBytes": -10 * GIB + 50 * MIB,
                    },
                ],
            }
        ],
        "trainer": [
            {
                "path": "sigkill",
                "graceMs": 5000,
                "releasedS": 5.4,
                "heldBytes": 9 * GIB,
                "exitS": 5.1,
                "killed": True,
            }
        ],
        "promotion": {"stepsS": {"wake": 0.3}, "totalS": 1.0, "probeOk": True},
    }
    results.update(changes)
    return results


def verdicts(results: dict) -> dict[str, bool | None]:
    return {t["name"]: t["pass"] for t in judge(results)}


def test_figures_within_the_targets_pass_on_a_gpu():
    assert verdicts(gpu_results()) == {
        "wake bandwidth, 8 GiB": True,
        "bit-exact wake, 8 GiB level 1": True,
        "NVML vs torch, 8 GiB level-1 sleep": True,  # 50 MiB of 10 GiB: 0.5%
        "trainer memory released, sigkill": True,  # 5.4 s against 5 s + 1 s
        "promotion probe": True,
    }


def test_figures_outside_the_targets_fail_on_a_gpu():
    results = gpu_results()
    engine = results["engines"][0]
    engine["wakeFractionOfPinned"] = 0.5
    engine["bitExact"] = False
    engine["stages"][1]["torchDeltaBytes"] = -9 * GIB
    results["trainer"][0]["releasedS"] = 6.5
    results["promotion"]["probeOk"] = False
    assert set(verdicts(results).values()) == {False}


def test_a_cpu_run_judges_nothing_and_the_table_still_renders():
    results = gpu_results(device="cpu", startedAt="2026-12-01T00:00:00+00:00", durationS=60.0)
    results["targets"] = judge(results)
    assert all(t["pass"] is None for t in results["targets"])
    table = render_table(results)
    assert "8 GiB L1" in table and "n/a" in table and "promotion (s): wake 0.300" in table
