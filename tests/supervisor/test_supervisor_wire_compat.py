"""The original control plane's view of our supervisor, and the wire contract's own checks.

A scripted original control plane drives a promotion and a demotion against our supervisor with
exactly the requests the original sends (its strict request schemas check each one before it
goes out), and the original's response schemas check every answer it would parse. The schemas
under tests/wire/original are written from the original's published zod objects.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from common.wire import contract
from common.wire.contract import check_response
from supervisor.gpu.facts import MIB
from supervisor.gpu.nvml import NvmlBackend
from tests.supervisor.fakes import FakeGpu, FakeNvml, FakeProcess, FakeServerState

ORIGINAL = Path(__file__).resolve().parents[1] / "wire" / "original"
MODELS = ["qwen-small", "llama-small", "big"]
CONFIG = {
    "drainBudgetMs": 0,
    "slots": [
        {
            "kind": "inference",
            "gpuIndex": 0,
            "models": [
                {"name": "qwen-small", "port": 18001},
                {"name": "llama-small", "port": 18002},
            ],
        },
        {"kind": "inference", "gpuIndex": 1, "models": [{"name": "big", "port": 18003}]},
        {"kind": "training", "gpuIndex": 0, "command": ["train"], "checkpointDir": "/tmp/haru-ck"},
    ],
}


def original(name: str) -> Draft202012Validator:
    schema = json.loads((ORIGINAL / f"{name}.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def refusals(name: str, body: Any) -> list[str]:
    return [e.message for e in original(name).iter_errors(body)]


class OriginalControlPlane:
    """The calls the original control plane makes, each checked both ways."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.answers: list[tuple[str, int]] = []

    def _post(self, path: str, body: dict, request_schema: str) -> httpx.Response:
        assert refusals(request_schema, body) == [], "the script sends what the original sends"
        response = self.client.post(path, json=body)
        self.answers.append((path, response.status_code))
        assert 200 <= response.status_code < 300, response.text
        return response

    def status(self) -> dict:
        query = "&".join(f"model={m}" for m in MODELS) + "&timeoutMs=4000"
        body = self.client.get(f"/v1/status?{query}").json()
        assert refusals("status.response", body) == []
        return body

    def gpu_memory(self) -> dict:
        body = self.client.get("/v1/gpu/memory").json()
        assert refusals("gpu-memory.response", body) == []
        return body

    def probe(self) -> dict:
        query = "&".join(f"model={m}" for m in MODELS)
        body = {"prompt": "ping", "maxTokens": 4, "timeoutMs": 4500}
        answer = self._post(f"/v1/probe?{query}", body, "probe.request").json()
        assert refusals("probe.response", answer) == []
        return answer

    def sleep(self) -> None:
        self._post("/v1/vllm/sleep", {}, "target.request")

    def wake(self) -> None:
        self._post("/v1/vllm/wake", {}, "target.request")

    def stop_training(self) -> None:
        self._post("/v1/training/stop", {"graceMs": 1000}, "training-stop.request")

    def start_training(self) -> None:
        self._post("/v1/training/start", {}, "empty.request")


def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def trainer(status: dict) -> dict:
    return next(s["training"] for s in status["slots"] if s["kind"] == "training")


def models(status: dict) -> dict[str, bool | None]:
    return {m["name"]: m["sleeping"] for s in status["slots"] for m in s.get("models", ())}


@pytest.fixture
def plane(api):
    gpus = [FakeGpu("NVIDIA H100", "GPU-a", 81559, 1024, processes=[FakeProcess(7, 1000 * MIB)])]
    backend = NvmlBackend(load=lambda: FakeNvml(gpus), process_name=lambda pid: "python")
    servers = {18001: FakeServerState("qwen-small"), 18002: FakeServerState("llama-small")}
    servers[18003] = FakeServerState("big")
    under_test = api(CONFIG, servers=servers, gpu=backend)
    client = TestClient(under_test.app)
    client.event_hooks = {"request": [], "response": [check_response]}
    with client:
        yield OriginalControlPlane(client)


def test_the_original_control_plane_drives_a_demotion_then_a_promotion(plane):
    # Demotion (sleep_vllm, start_training), as the original runs it on a standby.
    plane.sleep()
    until(lambda: all(s is True for s in models(plane.status()).values()))
    assert plane.status()["ready"] is False  # the original's meaning: not every model awake
    plane.start_training()
    until(lambda: trainer(plane.status())["state"] == "running")
    assert trainer(plane.status())["pids"]
    # Promotion: stop_training, verify_gpu, wake_vllm, probe.
    plane.stop_training()
    until(lambda: trainer(plane.status())["state"] == "idle")
    assert plane.gpu_memory()["gpus"][0]["totalMiB"] == 81559
    plane.wake()
    until(lambda: plane.status()["ready"] is True)
    answer = plane.probe()
    assert answer["ok"] is True
    assert all("error" not in r for r in answer["results"])  # absent, never null
    ready = plane.client.get("/v1/ready")
    assert ready.status_code == 200 and refusals("ready.response", ready.json()) == []
    # The original's start/stop answers are 200 and 202; ours match.
    assert ("/v1/training/start", 200) in plane.answers
    assert ("/v1/training/stop", 202) in plane.answers


def test_a_training_start_during_a_stop_is_a_no_op_as_in_the_original(plane, api):
    plane.start_training()
    plane.client.post("/v1/training/stop", json={"graceMs": 60_000})
    again = plane.client.post("/v1/training/start", json={})
    assert again.status_code == 200


def test_a_failed_probe_carries_its_error_and_still_passes_the_original_schema(api):
    servers = {18001: FakeServerState("qwen-small", chat_status=500)}
    servers[18002] = FakeServerState("llama-small")
    servers[18003] = FakeServerState("big")
    under_test = api(CONFIG, servers=servers)
    with TestClient(under_test.app) as client:
        answer = client.post("/v1/probe", json={}).json()
    failed = {r["model"]: r for r in answer["results"]}["qwen-small"]
    assert failed["ok"] is False and failed["error"].startswith("HTTP 500")
    assert refusals("probe.response", answer) == []


def test_the_probe_selects_models_from_the_originals_query(api):
    servers = {p: FakeServerState(n) for p, n in zip((18001, 18002, 18003), MODELS, strict=True)}
    under_test = api(CONFIG, servers=servers)
    with TestClient(under_test.app) as client:
        answer = client.post("/v1/probe?model=big", json={}).json()
        none = client.post("/v1/probe?model=", json={}).json()
    assert [r["model"] for r in answer["results"]] == ["big"]
    assert none == {"ok": False, "results": []}  # a lone empty value selects nothing


def test_the_originals_schemas_refuse_what_we_used_to_send():
    # The reasons for the contract: these bodies broke the original control plane.
    inference = {"gpuIndex": 0, "kind": "inference", "models": [], "training": None}
    assert refusals("status.response", {"slots": [inference], "ready": True})
    result = {"model": "a", "ok": True, "latencyMs": 1, "error": None}
    assert refusals("probe.response", {"ok": True, "results": [result]})
    assert refusals("probe.request", {"prompt": "p", "models": ["a"]})


def test_every_shipped_schema_is_valid_and_every_route_names_existing_schemas():
    names = set(contract.schema_names())
    for name in names:
        Draft202012Validator.check_schema(contract.load(name))
    for route in contract.ROUTES:
        assert route.request is None or route.request in names
        assert set(route.responses.values()) <= names
    assert contract.ERROR in names
