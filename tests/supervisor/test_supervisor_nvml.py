"""NVML code against a scripted NVML: normal GPUs, a MIG GPU, and no NVML at all."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.gpu.facts import MIB, GpuQueryFailed, GpuUnavailable
from supervisor.gpu.nvml import NvmlBackend
from tests.supervisor.fakes import LIBRARY_NOT_FOUND, FakeGpu, FakeMig, FakeNvml, FakeProcess


def backend(nvml: FakeNvml) -> NvmlBackend:
    return NvmlBackend(load=lambda: nvml, process_name=lambda pid: f"proc-{pid}")


def test_normal_gpus_report_memory_identity_and_processes():
    nvml = FakeNvml(
        [
            FakeGpu(
                "NVIDIA H100 80GB HBM3",
                "GPU-1111",
                81559,
                20480,
                cc=(9, 0),
                processes=[FakeProcess(100, 12288 * MIB), FakeProcess(101, None)],
            ),
            FakeGpu("NVIDIA L4", "GPU-2222", 23034, 0, cc=(8, 9), names_as_bytes=True),
        ]
    )
    gpus = [g.to_json() for g in backend(nvml).read_sync()]
    assert gpus[0] == {
        "index": 0,
        "usedMiB": 20480,
        "totalMiB": 81559,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-1111",
        "computeCapability": "9.0",
        "processes": [
            {"pid": 100, "usedMiB": 12288, "name": "proc-100"},
            {"pid": 101, "usedMiB": None, "name": "proc-101"},
        ],
        "mig": None,
    }
    assert gpus[1]["name"] == "NVIDIA L4"  # bytes from older nvidia-ml-py are decoded
    assert gpus[1]["uuid"] == "GPU-2222"
    assert gpus[1]["computeCapability"] == "8.9"


def test_mig_gpu_reports_per_instance_memory_instead_of_failing():
    mig_gpu = FakeGpu(
        "NVIDIA A100-SXM4-80GB",
        "GPU-mig",
        81920,
        0,
        cc=(8, 0),
        migs=[
            FakeMig(1, 0, "MIG-aaaa", 5000, 40192, [FakeProcess(300, 4800 * MIB)]),
            FakeMig(2, 0, "MIG-bbbb", 100, 19968),
        ],
    )
    (gpu,) = backend(FakeNvml([mig_gpu])).read_sync()
    body = gpu.to_json()
    assert body["usedMiB"] == 5100
    # The parent's memory query is unsupported under MIG: the total is the instances' sum.
    assert body["totalMiB"] == 40192 + 19968
    assert body["mig"]["enabled"] is True
    assert body["mig"]["instances"] == [
        {
            "gpuInstanceId": 1,
            "computeInstanceId": 0,
            "uuid": "MIG-aaaa",
            "usedMiB": 5000,
            "totalMiB": 40192,
            "processes": [{"pid": 300, "usedMiB": 4800, "name": "proc-300"}],
        },
        {
            "gpuInstanceId": 2,
            "computeInstanceId": 0,
            "uuid": "MIG-bbbb",
            "usedMiB": 100,
            "totalMiB": 19968,
            "processes": [],
        },
    ]
    assert body["processes"] == [{"pid": 300, "usedMiB": 4800, "name": "proc-300"}]


def test_mixed_host_with_mig_and_normal_gpus():
    nvml = FakeNvml(
        [
            FakeGpu("A100", "GPU-a", 81920, 10, migs=[FakeMig(1, 0, "MIG-x", 10, 9728)]),
            FakeGpu("A100", "GPU-b", 81920, 2048),
        ]
    )
    gpus = backend(nvml).read_sync()
    assert [g.mig is not None for g in gpus] == [True, False]
    assert [g.used_mib for g in gpus] == [10, 2048]


def test_missing_nvml_library_is_unavailable_not_a_crash():
    nvml = FakeNvml([], init_error=LIBRARY_NOT_FOUND)
    b = backend(nvml)
    with pytest.raises(GpuUnavailable, match="NVML is not available"):
        b.read_sync()
    # A later request tries again (a driver may have been loaded since).
    with pytest.raises(GpuUnavailable):
        b.read_sync()
    assert nvml.init_calls == 2


def test_missing_python_binding_is_unavailable():
    def no_module():
        raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed")

    with pytest.raises(GpuUnavailable, match="not installed"):
        NvmlBackend(load=no_module).read_sync()


def test_real_pynvml_on_a_host_without_a_gpu_is_unavailable_or_works():
    # On CI without a driver this must be a clean GpuUnavailable; on a GPU host it reads.
    real = NvmlBackend()
    try:
        gpus = real.read_sync()
    except GpuUnavailable:
        return
    finally:
        real.close()
    assert all(g.total_mib > 0 for g in gpus)


def test_query_failure_after_init_is_a_query_failure():
    nvml = FakeNvml([FakeGpu("x", "u", 10, 1)])
    nvml.fail_queries_with = 15  # NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuQueryFailed, match="NVML query failed"):
        backend(nvml).read_sync()


def test_async_read_runs_off_the_event_loop():
    nvml = FakeNvml([FakeGpu("x", "u", 1000, 500)])
    gpus = asyncio.run(backend(nvml).read())
    assert gpus[0].used_mib == 500
    assert nvml.init_calls == 1


@pytest.mark.parametrize("code", [4, 999])  # NVML_ERROR_NO_PERMISSION, NVML_ERROR_UNKNOWN
def test_hidden_process_lists_still_report_device_memory(code):
    # A sandboxed GPU host (the lent H200 runs in one) may refuse per-process queries while the
    # device's memory reads fine; verify_gpu needs only the latter, so the read must not fail.
    nvml = FakeNvml([FakeGpu("NVIDIA H200", "GPU-3333", 143771, 4096, process_error=code)])
    [gpu] = backend(nvml).read_sync()
    assert (gpu.used_mib, gpu.total_mib, gpu.processes) == (4096, 143771, ())


def test_a_lost_gpu_during_the_process_listing_still_fails_the_read():
    nvml = FakeNvml([FakeGpu("NVIDIA H200", "GPU-3333", 143771, 4096, process_error=15)])
    with pytest.raises(GpuQueryFailed):
        backend(nvml).read_sync()
