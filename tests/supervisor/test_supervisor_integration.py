"""The supervisor as a real process, managing real simulated engines and a real trainer."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import httpx
import pytest

from supervisor.gpu.sim_state import SimGpuState, pid_alive

pytestmark = pytest.mark.integration

QWEN_WEIGHTS, LLAMA_WEIGHTS, CONTEXT, TRAINER = 3000, 5000, 100, 20000


def host_config(tmp, tools, *, trainer_args=(), grace_ms=1000, llama=True) -> dict:
    models = [
        {
            "name": "qwen-small",
            "port": tools.free_port(),
            "profile": {
                "engine": "sim",
                "extraArgs": ["--weights-mib", str(QWEN_WEIGHTS), "--context-mib", str(CONTEXT)],
            },
        }
    ]
    if llama:
        models.append(
            {
                "name": "llama-small",
                "port": tools.free_port(),
                "profile": {"engine": "sim", "extraArgs": ["--weights-mib", str(LLAMA_WEIGHTS)]},
            }
        )
    return {
        "host": "east",
        "gpu": {"backend": "sim", "simStateFile": str(tmp / "gpu.json")},
        "slots": [
            {"kind": "inference", "gpuIndex": 0, "models": models},
            {
                "kind": "training",
                "gpuIndex": 0,
                "command": [
                    sys.executable,
                    "-m",
                    "supervisor.sim.trainer",
                    "--memory-mib",
                    str(TRAINER),
                    "--step-s",
                    "0.02",
                    *trainer_args,
                ],
                "checkpointDir": str(tmp / "ckpt"),
                "graceMs": grace_ms,
            },
        ],
    }


@pytest.fixture(scope="module")
def east(module_processes, tools, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("east")
    config = host_config(tmp, tools)
    sup = tools.start_supervisor(module_processes, config)
    with sup.client() as client:
        yield sup, client, config, tmp


@pytest.fixture
def sup(east):
    """The module's supervisor, with every model awake and no faults when a test starts."""
    _, client, config, _ = east
    for model in config["slots"][0]["models"]:
        httpx.post(f"http://127.0.0.1:{model['port']}/_sim/reset", timeout=5)
    assert client.post("/v1/vllm/wake").status_code == 200
    return east


def models_of(client: httpx.Client) -> dict[str, dict]:
    return {
        m["name"]: m for s in client.get("/v1/status").json()["slots"] for m in s.get("models", ())
    }


def used_mib(client: httpx.Client) -> int:
    return client.get("/v1/gpu/memory").json()["gpus"][0]["usedMiB"]


def test_status_reports_managed_servers_with_fingerprints(sup):
    _, client, _, _ = sup
    status = client.get("/v1/status").json()
    assert status["ready"] is True
    models = models_of(client)
    for name in ("qwen-small", "llama-small"):
        assert models[name]["sleeping"] is False
        assert models[name]["managed"] is True
        assert models[name]["fingerprint"].startswith("sha256:")
        assert models[name]["process"]["state"] == "running"
    assert status["slots"][1]["training"] == {**status["slots"][1]["training"], "state": "idle"}


def test_without_the_token_every_v1_route_is_refused(sup):
    s, _, _, _ = sup
    assert httpx.get(f"{s.url}/v1/status", timeout=5).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{s.url}/v1/vllm/sleep", headers=wrong, timeout=5).status_code == 401
    assert httpx.get(f"{s.url}/healthz", timeout=5).status_code == 200


def test_sleep_frees_the_weights_and_wake_restores_them(sup):
    _, client, _, _ = sup
    awake = used_mib(client)
    assert awake == QWEN_WEIGHTS + LLAMA_WEIGHTS + CONTEXT
    assert client.post("/v1/vllm/sleep").status_code == 200
    assert all(m["sleeping"] is True for m in models_of(client).values())
    assert used_mib(client) == awake - QWEN_WEIGHTS - LLAMA_WEIGHTS
    assert client.post("/v1/vllm/wake").status_code == 200
    assert all(m["sleeping"] is False for m in models_of(client).values())
    assert used_mib(client) == awake


def test_probe_passes_awake_and_times_out_asleep(sup):
    _, client, _, _ = sup
    body = {"prompt": "ping", "maxTokens": 4, "timeoutMs": 5000}
    awake = client.post("/v1/probe", json=body).json()
    assert awake["ok"] is True
    assert {r["model"] for r in awake["results"]} == {"qwen-small", "llama-small"}
    client.post("/v1/vllm/sleep")
    # A sleeping vLLM holds the request unanswered, so the probe runs out of time.
    asleep = client.post("/v1/probe", json={**body, "timeoutMs": 500}).json()
    assert asleep["ok"] is False
    assert all(not r["ok"] and "timed out" in r["error"] for r in asleep["results"])


def test_wake_fault_is_a_502_naming_the_model(sup):
    _, client, config, _ = sup
    llama_port = config["slots"][0]["models"][1]["port"]
    client.post("/v1/vllm/sleep")
    httpx.post(f"http://127.0.0.1:{llama_port}/_sim/faults", json={"wakeFails": True}, timeout=5)
    response = client.post("/v1/vllm/wake", json={"gpuIndex": 0})
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "wake_failed"
    assert [f["model"] for f in error["failures"]] == ["llama-small"]
    assert "llama-small" in error["message"]
    models = models_of(client)
    assert models["qwen-small"]["sleeping"] is False
    assert models["llama-small"]["sleeping"] is True


def test_unknown_gpu_is_a_404(sup):
    _, client, _, _ = sup
    response = client.post("/v1/vllm/sleep", json={"gpuIndex": 3})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "invalid_target"


def test_training_holds_memory_and_a_stop_releases_it(sup, tools):
    _, client, _, tmp = sup
    client.post("/v1/vllm/sleep")
    baseline = used_mib(client)
    started = client.post("/v1/training/start")
    assert started.status_code == 200
    (slot,) = started.json()["slots"]
    assert slot["state"] == "running" and len(slot["pids"]) == 1
    tools.wait_for(lambda: used_mib(client) == baseline + TRAINER)
    assert client.post("/v1/training/stop", json={"graceMs": 5000}).status_code == 202
    tools.wait_for(lambda: client.get("/v1/training/status").json()["slots"][0]["state"] == "idle")
    final = client.get("/v1/training/status").json()["slots"][0]
    assert final["lastExitCode"] == 0 and final["killed"] is False
    assert used_mib(client) == baseline
    assert list((tmp / "ckpt").glob("step-*.json"))


def test_a_stop_that_kills_at_once_answers_once_the_trainer_is_gone(sup, tools):
    """A failover's stop (grace 0) answers with the trainer gone, so the control plane's next
    status read finds the slot idle instead of looking again a retry later."""
    _, client, _, _ = sup
    client.post("/v1/vllm/sleep")
    assert client.post("/v1/training/start").status_code == 200
    stopped = client.post("/v1/training/stop", json={"graceMs": 0})
    assert stopped.status_code == 202
    (slot,) = stopped.json()["slots"]
    assert slot["state"] == "idle" and slot["killed"] is True and slot["pids"] == []
    assert client.get("/v1/training/status").json()["slots"][0]["state"] == "idle"


def test_a_crashed_server_is_restarted_and_put_back_to_sleep(sup, tools, module_processes):
    _, client, config, _ = sup
    qwen_port = config["slots"][0]["models"][0]["port"]
    before = models_of(client)["qwen-small"]["process"]
    client.post("/v1/vllm/sleep")
    httpx.post(f"http://127.0.0.1:{qwen_port}/_sim/faults", json={"crash": True}, timeout=5)
    tools.wait_for(
        lambda: models_of(client)["qwen-small"]["process"]["restarts"] == before["restarts"] + 1,
        timeout=10,
    )
    tools.wait_for(lambda: models_of(client)["qwen-small"]["sleeping"] is True, timeout=10)
    after = models_of(client)["qwen-small"]
    module_processes.adopt(after["process"]["pid"])
    assert after["process"]["pid"] != before["pid"]
    assert after["fingerprint"].startswith("sha256:")


def test_sigterm_stops_trainers_and_servers_and_exits_cleanly(processes, tools, tmp_path):
    config = host_config(
        tmp_path, tools, trainer_args=["--ignore-sigterm"], grace_ms=500, llama=False
    )
    s = tools.start_supervisor(processes, config)
    with s.client() as client:
        assert client.post("/v1/training/start").status_code == 200
        tools.wait_for(lambda: used_mib(client) == QWEN_WEIGHTS + CONTEXT + TRAINER)
        status = client.get("/v1/status").json()
    trainer_pid = status["slots"][1]["training"]["pids"][0]
    engine_pid = status["slots"][0]["models"][0]["process"]["pid"]
    processes.adopt(trainer_pid)
    os.kill(s.proc.pid, signal.SIGTERM)
    assert s.proc.wait(timeout=15) == 0
    assert not pid_alive(trainer_pid) and not pid_alive(engine_pid)
    assert SimGpuState(tmp_path / "gpu.json").holders() == []


def test_the_config_reaches_the_process_as_a_file_path_too(processes, tools, tmp_path):
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(host_config(tmp_path, tools, llama=False)))
    s = tools.start_supervisor(processes, {}, extra_env={"HARU_SUPERVISOR_CONFIG": str(path)})
    with s.client() as client:
        assert [m for m in models_of(client)] == ["qwen-small"]


def test_a_sleep_drains_the_simulated_engine_then_aborts_what_outlasts_the_budget(
    processes, tools, tmp_path
):
    reply = " ".join(f"w{i}" for i in range(200))
    port = tools.free_port()
    config = {
        "drainBudgetMs": 3000,
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "gpu.json")},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {
                        "name": "m",
                        "port": port,
                        "profile": {
                            "engine": "sim",
                            "extraArgs": ["--token-delay-ms", "20", "--reply", reply],
                        },
                    }
                ],
            }
        ],
    }
    sup = tools.start_supervisor(processes, config)
    results: dict[int, dict] = {}

    def generate(tokens: int) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
        results[tokens] = answer.json()["choices"][0]

    # 20 tokens (0.4 s) finish inside the budget; 200 tokens (4 s) outlast it and are aborted.
    threads = [threading.Thread(target=generate, args=(n,)) for n in (20, 200)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    with sup.client(timeout=30) as client:
        slept = client.post("/v1/vllm/sleep")
        assert slept.status_code == 200
        assert slept.json()["models"][0]["drainedMs"] >= 2500
    for t in threads:
        t.join(30)
    assert results[20]["finish_reason"] == "length"  # finished, not aborted
    assert results[200]["finish_reason"] == "abort"
    assert 20 < len(results[200]["message"]["content"].split()) < 200


def test_a_real_model_server_never_inherits_anything_named_like_a_secret(
    processes, tools, tmp_path
):
    secrets = {
        "HARU_API_TOKEN": "api-tok-never-leaks",
        "HARU_SUPERVISOR_MASTER_KEY": "master-never-leaks",
        "AWS_SECRET_ACCESS_KEY": "aws-never-leaks",
        "PGPASSWORD": "pg-never-leaks",
        "openai_api_key": "lower-never-leaks",
    }
    config = host_config(tmp_path, tools, llama=False)
    config["slots"] = config["slots"][:1]  # the model server alone
    sup = tools.start_supervisor(processes, config, extra_env=secrets)
    with sup.client() as client:
        (model,) = models_of(client).values()
    pid = model["process"]["pid"]
    processes.adopt(pid)
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    names = {k.decode() for k in environ}
    leaked = sorted(names & (secrets.keys() | {"HARU_SUPERVISOR_TOKEN"}))
    assert not leaked, f"the model server inherited {leaked}"
    assert not any(v.encode() in environ.values() for v in secrets.values())
    assert sup.token is not None and sup.token.encode() not in environ.values()
    assert environ[b"CUDA_VISIBLE_DEVICES"] == b"0"  # the launch's own variables are there
