"""The API over scripted model servers, spawner and NVML: shapes, fan-out, errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.testclient import TestClient

from common.wire.contract import check_response
from supervisor.gpu.facts import MIB
from supervisor.gpu.nvml import NvmlBackend
from tests.supervisor.fakes import FakeGpu, FakeNvml, FakeProcess, FakeServerState, FakeSpawner

CONFIG = {
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
    ]
}


def servers(**overrides: dict) -> dict[int, FakeServerState]:
    out = {
        18001: FakeServerState("qwen-small"),
        18002: FakeServerState("llama-small"),
        18003: FakeServerState("big"),
    }
    for port, changes in overrides.items():
        for key, value in changes.items():
            setattr(out[int(port.lstrip("p"))], key, value)
    return out


@pytest.fixture
def setup(api):
    under_test = api(CONFIG, servers=servers())
    with checked_client(under_test.app) as client:
        yield client, under_test


def models_of(status: dict) -> dict[str, dict]:
    return {m["name"]: m for s in status["slots"] for m in s.get("models", ())}


def test_status_has_the_original_shape(setup):
    client, _ = setup
    body = client.get("/v1/status").json()
    assert body["ready"] is True
    first = body["slots"][0]
    assert (first["gpuIndex"], first["kind"]) == (0, "inference")
    model = first["models"][0]
    assert {k: model[k] for k in ("name", "port", "sleeping")} == {
        "name": "qwen-small",
        "port": 18001,
        "sleeping": False,
    }
    assert model["engine"] == "vllm"
    assert "fingerprint" not in model  # not started by the supervisor: unknown, so left out
    assert "training" not in first  # optional fields are left out, never null
    training = body["slots"][2]
    assert training["kind"] == "training"
    assert training["training"]["state"] == "idle" and training["training"]["pids"] == []


def test_non_boolean_is_sleeping_reads_as_unknown(api):
    under_test = api(CONFIG, servers=servers(p18002={"is_sleeping_value": "false"}))
    with checked_client(under_test.app) as client:
        status = client.get("/v1/status").json()
        assert models_of(status)["llama-small"]["sleeping"] is None
        assert status["ready"] is False and status["stateKnown"] is False
        ready = client.get("/v1/ready")
        assert ready.status_code == 200  # as in the original: the answer is in the body
        assert ready.json()["ready"] is False and ready.json()["stateKnown"] is False


def test_unreachable_server_reads_as_unknown_with_a_reason(api):
    under_test = api(CONFIG, servers=servers(p18003={"reachable": False}))
    with checked_client(under_test.app) as client:
        big = models_of(client.get("/v1/status").json())["big"]
        assert big["sleeping"] is None
        assert "connection refused" in big["error"]
        assert "big:" in client.get("/v1/ready").json()["reasons"][0]


def test_sleep_then_wake_every_model(setup):
    client, under_test = setup
    response = client.post("/v1/vllm/sleep")
    assert response.status_code == 200
    assert {m["name"] for m in response.json()["models"]} == {"qwen-small", "llama-small", "big"}
    assert all(m["sleeping"] is True for m in models_of(client.get("/v1/status").json()).values())
    assert "POST /sleep" in under_test.servers.servers[18001].calls
    assert client.post("/v1/vllm/wake").status_code == 200
    assert all(m["sleeping"] is False for m in models_of(client.get("/v1/status").json()).values())


def test_sleep_and_wake_are_idempotent(setup):
    client, _ = setup
    for _ in range(2):
        assert client.post("/v1/vllm/sleep", json={}).status_code == 200
    for _ in range(2):
        assert client.post("/v1/vllm/wake").status_code == 200


def test_sleep_one_gpu_only(setup):
    client, under_test = setup
    response = client.post("/v1/vllm/sleep", json={"gpuIndex": 1})
    assert [m["name"] for m in response.json()["models"]] == ["big"]
    assert under_test.servers.servers[18003].sleeping is True
    assert under_test.servers.servers[18001].sleeping is False


def test_unknown_gpu_is_an_invalid_target(setup):
    client, _ = setup
    for path in ("/v1/vllm/sleep", "/v1/vllm/wake"):
        response = client.post(path, json={"gpuIndex": 7})
        assert response.status_code == 404
        assert response.json()["error"] == {
            "code": "invalid_target",
            "message": "no inference slot on GPU 7",
        }


@pytest.mark.parametrize(
    "body",
    [b'{"gpuIndex": "0"}', b'{"gpu": 0}', b"[1]", b"{nope", b'{"gpuIndex": -1}'],
)
def test_malformed_bodies_are_invalid_requests(setup, body):
    client, _ = setup
    response = client.post("/v1/vllm/sleep", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


def test_wake_failure_is_a_502_naming_each_failed_model(api):
    under_test = api(CONFIG, servers=servers(p18002={"wake_status": 500, "sleeping": True}))
    with checked_client(under_test.app) as client:
        response = client.post("/v1/vllm/wake")
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "wake_failed"
        assert "llama-small" in error["message"]
        assert error["failures"] == [
            {"model": "llama-small", "gpuIndex": 0, "error": "wake returned HTTP 500: boom"}
        ]
        # The others were still woken: one bad server must not hold the rest hostage.
        assert under_test.servers.servers[18001].calls[-1] == "POST /wake_up"


def test_unreachable_server_fails_the_sleep_with_its_reason(api):
    under_test = api(CONFIG, servers=servers(p18001={"reachable": False}))
    with checked_client(under_test.app) as client:
        response = client.post("/v1/vllm/sleep", json={"gpuIndex": 0})
        assert response.status_code == 502
        (failure,) = response.json()["error"]["failures"]
        assert failure["model"] == "qwen-small"
        assert "connection refused" in failure["error"]


def test_fan_out_is_concurrent(api):
    slow = {"delay_s": 0.3}
    under_test = api(CONFIG, servers=servers(p18001=slow, p18002=slow, p18003=slow))
    with checked_client(under_test.app) as client:
        started = time.monotonic()
        assert client.post("/v1/vllm/wake").status_code == 200
        assert time.monotonic() - started < 0.8


def test_probe_passes_awake_models(setup):
    client, _ = setup
    body = client.post(
        "/v1/probe", json={"prompt": "ping", "maxTokens": 4, "timeoutMs": 2000}
    ).json()
    assert body["ok"] is True
    assert {r["model"] for r in body["results"]} == {"qwen-small", "llama-small", "big"}
    for result in body["results"]:
        assert result["ok"] is True and "error" not in result  # absent, never null
        assert isinstance(result["latencyMs"], int)


def test_probe_fails_an_empty_reply(api):
    under_test = api(CONFIG, servers=servers(p18003={"reply": ""}))
    with checked_client(under_test.app) as client:
        body = client.post("/v1/probe", json={}).json()
        assert body["ok"] is False
        big = next(r for r in body["results"] if r["model"] == "big")
        assert big == {**big, "ok": False, "error": "reply content is empty"}


def test_probe_fails_a_sleeping_or_erroring_model(api):
    under_test = api(
        CONFIG, servers=servers(p18001={"sleeping": True}, p18002={"chat_status": 500})
    )
    with checked_client(under_test.app) as client:
        results = {r["model"]: r for r in client.post("/v1/probe").json()["results"]}
        assert results["qwen-small"]["error"].startswith("HTTP 503")
        assert results["llama-small"]["error"].startswith("HTTP 500")
        assert results["big"]["ok"] is True


def test_probe_times_out_per_model(api):
    under_test = api(CONFIG, servers=servers(p18001={"delay_s": 1.0}))
    with checked_client(under_test.app) as client:
        body = client.post("/v1/probe", json={"timeoutMs": 100, "models": ["qwen-small"]}).json()
        assert body["results"] == [
            {
                **body["results"][0],
                "model": "qwen-small",
                "ok": False,
                "error": "timed out after 100ms",
            }
        ]


def test_probe_validates_its_body(setup):
    client, _ = setup
    assert client.post("/v1/probe", json={"maxTokens": 0}).status_code == 400
    assert client.post("/v1/probe", json={"maxTokens": 257}).status_code == 400
    assert client.post("/v1/probe", json={"prompt": "x" * 9000}).status_code == 400


def test_a_golden_probe_is_greedy_and_seeded_and_returns_each_answer_and_the_engine(api):
    state = servers(p18001={"reply": "Hello qwen", "version": "0.11.2"})
    under_test = api(CONFIG, servers=state)
    with checked_client(under_test.app) as client:
        status = client.get("/v1/status").json()
        assert "probe.golden" in status["features"]
        body = client.post(
            "/v1/probe",
            json={"models": ["qwen-small"], "seed": 1337, "adapters": {"qwen-small": ["sql"]}},
        ).json()
    assert body["ok"] is True
    base, sql = body["results"]
    assert base == {**base, "model": "qwen-small", "answer": "Hello qwen"}
    assert "adapter" not in base and base["engineVersion"] == "0.11.2"
    assert sql == {**sql, "model": "qwen-small", "adapter": "sql", "answer": "Hello qwen"}
    sent = state[18001].chat_bodies
    assert sorted(b["model"] for b in sent) == ["qwen-small", "sql"]  # the adapter by name
    assert all(b["temperature"] == 0 and b["seed"] == 1337 for b in sent)


def test_a_plain_probe_sends_no_sampling_fields_and_returns_no_answer(api):
    state = servers()
    under_test = api(CONFIG, servers=state)
    with checked_client(under_test.app) as client:
        body = client.post("/v1/probe", json={"models": ["big"]}).json()
    assert "answer" not in body["results"][0] and "engineVersion" not in body["results"][0]
    assert "seed" not in state[18003].chat_bodies[0]
    assert "temperature" not in state[18003].chat_bodies[0]


@pytest.mark.parametrize(
    "adapters",
    [["sql"], {"qwen-small": "sql"}, {"qwen-small": [""]}, {"qwen-small": ["a"] * 17}],
)
def test_a_bad_adapter_selection_is_refused(setup, adapters):
    client, _ = setup
    response = client.post("/v1/probe", json={"seed": 1, "adapters": adapters})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("adapters")


def test_a_negative_seed_is_refused(setup):
    client, _ = setup
    assert client.post("/v1/probe", json={"seed": -1}).status_code == 400


def test_probe_of_a_model_the_host_does_not_serve_fails_that_model_only(setup):
    client, _ = setup
    body = client.post("/v1/probe", json={"models": ["qwen-small", "nope"]}).json()
    assert body["ok"] is False
    results = {r["model"]: r for r in body["results"]}
    assert results["qwen-small"]["ok"] is True
    assert results["nope"] == {
        "model": "nope",
        "ok": False,
        "latencyMs": 0,
        "error": "not served on this host",
    }


def test_training_start_stop_and_status(setup):
    client, under_test = setup
    response = client.post("/v1/training/start")
    assert response.status_code == 200  # the original's status; stop stays 202
    (slot,) = response.json()["slots"]
    assert slot["state"] == "running" and len(slot["pids"]) == 1
    assert client.post("/v1/training/start").status_code == 200
    assert len(under_test.spawner.spawned) == 1  # idempotent: still one trainer
    stopped = client.post("/v1/training/stop", json={"graceMs": 1000})
    assert stopped.status_code == 202
    status = client.get("/v1/training/status").json()["slots"][0]
    assert status["state"] == "idle" and status["lastExitCode"] == 0


def test_training_start_body_must_be_empty(setup):
    client, _ = setup
    response = client.post("/v1/training/start", json={"gpuIndex": 0})
    assert response.status_code == 400


def test_training_spawn_failure_reports_and_returns_to_idle(api):
    under_test = api(
        CONFIG,
        servers=servers(),
        spawner=FakeSpawner(fail_with=FileNotFoundError(2, "No such file", "train")),
    )
    with checked_client(under_test.app) as client:
        response = client.post("/v1/training/start")
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "spawn_failed"
        status = client.get("/v1/status").json()["slots"][2]["training"]
        assert status["state"] == "idle"
        assert "spawn failed" in status["lastError"]


def test_training_start_is_refused_while_shutting_down(setup):
    client, under_test = setup
    under_test.host.shutting_down = True
    response = client.post("/v1/training/start")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "shutting_down"
    under_test.host.shutting_down = False


def test_gpu_memory_without_nvml_is_a_501(setup):
    client, _ = setup
    response = client.get("/v1/gpu/memory")
    assert response.status_code == 501
    assert response.json()["error"]["code"] == "gpu_unavailable"


def test_gpu_memory_with_nvml(api):
    gpus = [FakeGpu("NVIDIA H100", "GPU-a", 81559, 1024, processes=[FakeProcess(4242, 1000 * MIB)])]
    backend = NvmlBackend(load=lambda: FakeNvml(gpus), process_name=lambda pid: "python")
    under_test = api(CONFIG, servers=servers(), gpu=backend)
    with checked_client(under_test.app) as client:
        body = client.get("/v1/gpu/memory").json()
        assert body["gpus"][0]["usedMiB"] == 1024
        assert body["gpus"][0]["totalMiB"] == 81559
        assert body["gpus"][0]["processes"] == [{"pid": 4242, "usedMiB": 1000, "name": "python"}]


def test_gpu_query_failure_is_a_502(api):
    nvml = FakeNvml([FakeGpu("x", "u", 1, 1)])
    nvml.fail_queries_with = 15  # GPU is lost
    under_test = api(CONFIG, servers=servers(), gpu=NvmlBackend(load=lambda: nvml))
    with checked_client(under_test.app) as client:
        response = client.get("/v1/gpu/memory")
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "gpu_query_failed"


def test_unknown_routes_and_methods_use_the_envelope(setup):
    client, _ = setup
    assert client.get("/nope").json()["error"]["code"] == "not_found"
    wrong = client.get("/v1/vllm/sleep")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_oversized_bodies_are_refused(setup):
    client, _ = setup
    response = client.post("/v1/probe", content=b"{" + b" " * 70_000 + b"}")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_an_oversized_body_is_refused_before_it_is_all_read(setup):
    # Straight at the ASGI app: the test client would buffer the whole body first.
    client, under_test = setup
    received = []
    answer: list[dict] = []

    async def receive():  # 256 MB in 64 KB chunks, no Content-Length
        received.append(1)
        return {"type": "http.request", "body": b" " * 65536, "more_body": len(received) < 4096}

    async def send(message):
        answer.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/probe",
        "raw_path": b"/v1/probe",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    asyncio.run(under_test.app(scope, receive, send))
    assert answer[0]["status"] == 413
    assert len(received) <= 3  # stopped at the 64 KB cap, not after 256 MB

    declared = client.post(
        "/v1/probe", content=b"{}", headers={"Content-Length": str(256 * 1024 * 1024)}
    )
    assert declared.status_code == 413


def test_deeply_nested_json_is_a_400_envelope(setup):
    client, _ = setup
    response = client.post("/v1/probe", content=b"[" * 60_000)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert "nested deeper than" in response.json()["error"]["message"]


def checked_client(app) -> TestClient:
    """A test client that checks every answer against the wire contract's schemas."""
    client = TestClient(app)
    client.event_hooks = {"request": [], "response": [check_response]}
    return client
