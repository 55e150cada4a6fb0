"""The plan on the host: checked against the real GPUs at start-up, and before every wake."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from common.strict_json import ConfigError
from supervisor.config import parse_config
from supervisor.gpu.facts import GpuFacts, GpuUnavailable
from supervisor.training import trainer_env
from tests.supervisor.fakes import FakeServerState

PLANNED = {
    "host": "east",
    "plan": {
        "gpus": [{"index": 0, "type": "H100", "memoryMiB": 81920}],
        "safetyMarginMiB": 1024,
    },
    "slots": [
        {
            "kind": "inference",
            "gpuIndex": 0,
            "models": [
                {"name": "qwen-small", "port": 18001, "memoryMiB": 20000, "sleepResidueMiB": 2000},
                {"name": "llama-small", "port": 18002, "memoryMiB": 30000, "sleepResidueMiB": 3000},
            ],
        },
        {
            "kind": "training",
            "gpuIndex": 0,
            "command": ["train"],
            "checkpointDir": "/tmp/haru-ck",
            "memoryLimitMiB": 75000,
        },
    ],
}


class ScriptedGpus:
    """A GPU backend whose facts the test sets: the injectable NVML boundary."""

    name = "scripted"

    def __init__(self, *facts: GpuFacts, fails: bool = False) -> None:
        self.facts = list(facts)
        self.fails = fails
        self.reads = 0

    def read_sync(self) -> list[GpuFacts]:
        self.reads += 1
        if self.fails:
            raise GpuUnavailable("no NVML library on this host")
        return list(self.facts)

    async def read(self) -> list[GpuFacts]:
        return self.read_sync()


def h100(used_mib: int, *, total: int = 81559, name: str = "NVIDIA H100 80GB HBM3") -> GpuFacts:
    return GpuFacts(index=0, used_mib=used_mib, total_mib=total, name=name)


def asleep() -> dict[int, FakeServerState]:
    return {
        18001: FakeServerState("qwen-small", sleeping=True),
        18002: FakeServerState("llama-small", sleeping=True),
    }


def test_config_carries_the_plan_memory_and_the_trainer_budget():
    config = parse_config(PLANNED, cwd=Path("/"))
    qwen = config.models[0]
    assert (qwen.memory_mib, qwen.sleep_residue_mib, qwen.wake_mib) == (20000, 2000, 18000)
    assert config.training_slots[0].memory_limit_mib == 75000
    assert config.plan.gpus[0].memory_mib == 81920 and config.plan.safety_margin_mib == 1024


def test_trainer_gets_its_budget_in_the_environment():
    slot = parse_config(PLANNED, cwd=Path("/")).training_slots[0]
    assert trainer_env(slot, {}, {})["HARU_GPU_MEMORY_LIMIT_MIB"] == "75000"
    unplanned = parse_config(
        {"slots": [{"kind": "training", "gpuIndex": 0, "command": ["t"], "checkpointDir": "/x"}]},
        cwd=Path("/"),
    ).training_slots[0]
    assert "HARU_GPU_MEMORY_LIMIT_MIB" not in trainer_env(unplanned, {}, {})


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"memoryMiB": 0}, "slots[0].models[0].memoryMiB: must be at least 1"),
        ({"sleepResidueMiB": -1}, "slots[0].models[0].sleepResidueMiB: must be at least 0"),
    ],
)
def test_bad_plan_numbers_are_refused_by_path(bad, error):
    data = copy.deepcopy(PLANNED)
    data["slots"][0]["models"][0].update(bad)
    with pytest.raises(ConfigError) as err:
        parse_config(data, cwd=Path("/"))
    assert any(error in line for line in err.value.errors), err.value.errors


def test_status_omits_plan_mismatches_when_the_gpus_match(api):
    under_test = api(PLANNED, servers=asleep(), gpu=ScriptedGpus(h100(3000)))
    with TestClient(under_test.app) as client:
        assert "planMismatches" not in client.get("/v1/status").json()


@pytest.mark.parametrize(
    ("facts", "codes"),
    [
        ([h100(0, name="NVIDIA A100-SXM4-80GB")], ["gpu_type_mismatch"]),
        ([h100(0, total=40960)], ["gpu_memory_mismatch"]),
        ([], ["gpu_missing"]),
    ],
    ids=["type", "memory", "missing"],
)
def test_status_reports_where_the_real_gpus_differ_from_the_plan(api, facts, codes):
    under_test = api(PLANNED, servers=asleep(), gpu=ScriptedGpus(*facts))
    with TestClient(under_test.app) as client:
        mismatches = client.get("/v1/status").json()["planMismatches"]
    assert [m["code"] for m in mismatches] == codes
    assert all("GPU 0" in m["message"] for m in mismatches)


def test_status_says_when_the_plan_cannot_be_verified(api):
    under_test = api(PLANNED, servers=asleep(), gpu=ScriptedGpus(fails=True))
    with TestClient(under_test.app) as client:
        (mismatch,) = client.get("/v1/status").json()["planMismatches"]
    assert mismatch["code"] == "gpu_facts_unavailable"


def test_wake_is_refused_when_free_memory_does_not_cover_the_sleeping_servers(api):
    # Waking restores 18000 + 27000 = 45000 MiB. Residues 5000 + a leak of 33000 leave 43559.
    gpus = ScriptedGpus(h100(5000 + 33000))
    under_test = api(PLANNED, servers=asleep(), gpu=gpus)
    with TestClient(under_test.app) as client:
        response = client.post("/v1/vllm/wake")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "insufficient_gpu_memory"
    assert error["message"] == (
        "GPU 0: 43559 MiB free, waking qwen-small, llama-small needs 45000 MiB "
        "(38000 of 81559 MiB in use)"
    )
    assert error["gpus"][0]["neededMiB"] == 45000
    # No engine was asked to wake.
    assert not any("/wake_up" in c for s in under_test.servers.servers.values() for c in s.calls)


def test_wake_goes_ahead_when_it_fits(api):
    under_test = api(PLANNED, servers=asleep(), gpu=ScriptedGpus(h100(5000 + 30000)))
    with TestClient(under_test.app) as client:
        assert client.post("/v1/vllm/wake").status_code == 200


def test_awake_servers_need_no_room(api):
    servers = asleep()
    servers[18002].sleeping = False  # llama is up: only qwen's 18000 must fit
    under_test = api(PLANNED, servers=servers, gpu=ScriptedGpus(h100(81559 - 18000)))
    with TestClient(under_test.app) as client:
        assert client.post("/v1/vllm/wake").status_code == 200


def test_a_config_without_plan_memory_wakes_without_reading_the_gpus(api):
    data = copy.deepcopy(PLANNED)
    for m in data["slots"][0]["models"]:
        del m["memoryMiB"]
    del data["plan"]
    gpus = ScriptedGpus(h100(81000))
    under_test = api(data, servers=asleep(), gpu=gpus)
    with TestClient(under_test.app) as client:
        assert client.post("/v1/vllm/wake").status_code == 200
    assert gpus.reads == 0
