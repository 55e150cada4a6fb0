"""The simulated engine with real torch weights: vLLM's sleep and wake contract, over HTTP.

On the CPU nothing goes to a driver, but every byte still moves: the weights leave the device
for host memory (level 1) or are dropped and reloaded from the safetensors file (level 2), and
the checksum proves they come back bit for bit.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

# The torch tier: left out of `make test`, run by `make test-torch` (and .ci/run).
pytestmark = [pytest.mark.torch, pytest.mark.integration]

WEIGHTS_MIB, KV_MIB = 24, 8
# A torch process imports torch first: seconds, more on a busy machine.
START_TIMEOUT_S = 180.0
MIB = 1024 * 1024


def start_engine(processes, tools, torch_python, *args: str):
    port = tools.free_port()
    processes.start(
        [
            torch_python,
            "-m",
            "supervisor.sim",
            "--backend",
            "torch",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--model",
            "tiny",
            "--chunk-mib",
            "8",
            *args,
        ],
        env=tools.child_env(),
    )
    url = f"http://127.0.0.1:{port}"
    tools.wait_for(
        lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, timeout=START_TIMEOUT_S
    )
    return url


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    return tmp_path_factory.mktemp("torch-engine") / "weights.safetensors"


@pytest.fixture(scope="module")
def engine(module_processes, tools, torch_python, weights_file):
    return start_engine(
        module_processes,
        tools,
        torch_python,
        "--weights-mib",
        str(WEIGHTS_MIB),
        "--kv-cache-mib",
        str(KV_MIB),
        "--weights-file",
        str(weights_file),
        "--seed",
        "7",
    )


@pytest.fixture
def client(engine):
    with httpx.Client(base_url=engine, timeout=60, trust_env=False) as c:
        assert c.post("/wake_up").status_code == 200
        yield c


def facts(c: httpx.Client, checksum: bool = False) -> dict:
    response = c.get("/_sim/backend", params={"checksum": "1"} if checksum else None)
    assert response.status_code == 200, response.text
    return response.json()


def chat() -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def test_awake_engine_holds_its_weights_and_kv_cache_on_the_device(client):
    f = facts(client)
    assert f["backend"] == "torch" and f["device"] == "cpu"
    assert f["weightsOnDeviceBytes"] == f["weightsBytes"] == WEIGHTS_MIB * MIB
    assert f["kvCacheBytes"] == KV_MIB * MIB
    assert f["weightsInHostBytes"] == 0
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}


def test_level1_sleep_moves_weights_to_host_and_wake_restores_them_bit_exactly(client):
    before = facts(client, checksum=True)["checksum"]
    answer = client.post("/sleep", params={"level": "1"})
    assert answer.json() == {"status": "sleeping", "level": 1}
    asleep = facts(client, checksum=True)
    assert asleep["weightsOnDeviceBytes"] == 0
    assert asleep["kvCacheBytes"] == 0
    assert asleep["weightsInHostBytes"] == WEIGHTS_MIB * MIB
    assert asleep["hostPinned"] is False  # pinning needs CUDA
    assert asleep["checksum"] == before  # the host copy is the same bits
    assert client.post("/wake_up").json() == {"status": "awake", "tags": None}
    awake = facts(client, checksum=True)
    assert awake["checksum"] == before
    assert awake["weightsInHostBytes"] == 0  # the host copy is freed once the weights are back
    wake = awake["lastWeightsWake"]
    assert wake["source"] == "pinned" and wake["bytes"] == WEIGHTS_MIB * MIB
    assert wake["bytesPerS"] > 0


def test_wake_with_the_weights_tag_leaves_the_engine_asleep_until_the_kv_cache(client):
    client.post("/sleep", params={"level": "1"})
    partial = client.post("/wake_up", params={"tags": "weights"})
    assert partial.json() == {"status": "sleeping", "tags": ["weights"]}
    assert client.get("/is_sleeping").json() == {"is_sleeping": True}
    f = facts(client)
    assert f["weightsOnDeviceBytes"] == WEIGHTS_MIB * MIB and f["kvCacheBytes"] == 0
    rest = client.post("/wake_up", params={"tags": "kv_cache"})
    assert rest.json() == {"status": "awake", "tags": ["kv_cache"]}
    assert facts(client)["kvCacheBytes"] == KV_MIB * MIB


def test_a_request_sent_while_asleep_is_held_and_answered_after_the_wake(client, engine):
    client.post("/sleep", params={"level": "1"})
    result: dict = {}

    def send() -> None:
        r = httpx.post(f"{engine}/v1/chat/completions", json=chat(), timeout=60, trust_env=False)
        result["status"], result["at"] = r.status_code, time.monotonic()

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.5)
    assert "status" not in result  # held, not refused
    woke_at = time.monotonic()
    client.post("/wake_up")
    sender.join(30)
    assert result["status"] == 200
    assert result["at"] >= woke_at


def test_level2_drops_the_weights_and_wake_reloads_them_from_the_file(client, weights_file):
    before = facts(client, checksum=True)["checksum"]
    assert client.post("/sleep", params={"level": "2"}).json() == {"status": "sleeping", "level": 2}
    asleep = facts(client)
    assert asleep["weightsOnDeviceBytes"] == 0 and asleep["weightsInHostBytes"] == 0
    assert asleep["weightsFile"] == str(weights_file)
    client.post("/wake_up")
    awake = facts(client, checksum=True)
    assert awake["lastWeightsWake"]["source"] == "file"
    assert awake["checksum"] == before


def test_sleep_level_3_and_unknown_wake_tags_are_refused(client):
    assert client.post("/sleep", params={"level": "3"}).status_code == 400
    assert client.post("/wake_up", params={"tags": "optimizer"}).status_code == 400
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}


def test_an_engine_started_on_an_existing_weights_file_loads_it(
    client, processes, tools, torch_python, weights_file
):
    reference = facts(client, checksum=True)["checksum"]
    # Another seed would generate other weights: equal checksums mean the file was read.
    other = start_engine(
        processes,
        tools,
        torch_python,
        "--weights-mib",
        str(WEIGHTS_MIB),
        "--weights-file",
        str(weights_file),
        "--seed",
        "8",
    )
    with httpx.Client(base_url=other, timeout=60, trust_env=False) as c:
        f = facts(c, checksum=True)
    assert f["lastLoad"]["source"] == "file"
    assert f["checksum"] == reference
