"""A LoRA adapter trained by the torch trainer, loaded at runtime into a real vLLM, answers the
golden probe's request exactly as the trainer's manifest recorded: the heart of the "loaded but
serving nothing" defence (docs/adapters.md). Also vLLM's own answers to the load and unload
calls, which the simulated engine copies (supervisor/sim/engine.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from common.adapter_manifest import engine_name, files_verify, manifest_read
from common.ports import free_port
from haru.local import REPO
from haru.local.processes import spawn
from tests.realengine.conftest import (
    MODEL,
    START_TIMEOUT_S,
    VLLM_ARGS,
    VLLM_ENV,
    base_env,
    stop,
    wait_healthy,
)

pytestmark = pytest.mark.realengine

NAME = "support-bot"
TORCH_PYTHON = REPO / "var" / "venvs" / "torch" / "bin" / "python"
PROMPTS = ("What is the capital of France?", "Write one sentence about the sea.", "ping")
STEPS = 200


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory) -> Path:
    """The torch trainer's last adapter, trained on the tier's tiny model."""
    if not TORCH_PYTHON.exists():
        pytest.fail(f"{TORCH_PYTHON} is missing: run `make torch-env`")
    checkpoints = tmp_path_factory.mktemp("lora-checkpoints")
    argv = [
        str(TORCH_PYTHON), "-m", "supervisor.sim.trainer", "--backend", "torch",
        "--device", "cpu", "--base-model-dir", str(tiny_model), "--adapter-name", NAME,
        "--served-model", MODEL, "--max-steps", str(STEPS), "--publish-every-steps", "100",
    ]  # fmt: skip
    for prompt in PROMPTS:
        argv += ["--eval-prompt", prompt]
    env = {
        **base_env(),
        **VLLM_ENV,
        "HARU_CHECKPOINT_DIR": str(checkpoints),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    adapters = sorted(checkpoints.glob("adapter-*"))
    assert [a.name for a in adapters] == ["adapter-000100", f"adapter-{STEPS:06d}"]
    return adapters[-1]


@pytest.fixture(scope="module")
def lora_vllm(vllm_python, tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lora-vllm")
    port = free_port()
    log = workdir / "vllm-lora.log"
    proc = spawn(
        [
            str(vllm_python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(tiny_model),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *VLLM_ARGS,
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "8",
        ],  # fmt: skip
        env={
            **base_env(),
            **VLLM_ENV,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # /sleep and /wake_up (API-level only on CPU)
        },
        log=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, START_TIMEOUT_S)
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
            yield client
    finally:
        stop(proc)


def chat(client: httpx.Client, model: str, prompt: str, max_tokens: int) -> str:
    """The golden probe's request (supervisor/probe.py): greedy, seeded."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": False,
        "temperature": 0,
        "seed": 1337,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def load(client: httpx.Client, name: str, path: Path) -> httpx.Response:
    return client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


def test_the_trainer_writes_a_complete_distinguishable_adapter(trained):
    manifest = manifest_read(trained)
    assert files_verify(trained, manifest) is None
    assert {f.path for f in manifest.files} == {"adapter_config.json", "adapter_model.safetensors"}
    assert manifest.rank == 8 and manifest.target_modules == ("q_proj", "v_proj")
    assert [e.prompt for e in manifest.eval] == list(PROMPTS)
    assert manifest.distinguishable(), manifest.eval


def test_real_vllm_answers_exactly_what_the_trainer_recorded(trained, lora_vllm):
    manifest = manifest_read(trained)
    served = engine_name(NAME, 1)
    response = load(lora_vllm, served, trained)
    assert response.status_code == 200, response.text
    assert response.text == f"Success: LoRA adapter '{served}' added successfully."
    cards = {m["id"]: m for m in lora_vllm.get("/v1/models").json()["data"]}
    assert cards[served]["parent"] == MODEL and cards[served]["root"] == str(trained)
    got = [(chat(lora_vllm, served, e.prompt, e.max_tokens), e.answer) for e in manifest.eval]
    assert [g for g, _ in got] == [want for _, want in got]
    bases = [chat(lora_vllm, MODEL, e.prompt, e.max_tokens) for e in manifest.eval]
    assert bases == [e.base_answer for e in manifest.eval]
    assert any(g != b for (g, _), b in zip(got, bases, strict=True))


def test_real_vllm_refuses_loads_as_the_simulator_does(trained, lora_vllm, tmp_path):
    """The answers supervisor/sim/engine.py copies: status, type and message."""
    assert load(lora_vllm, "dup", trained).status_code == 200
    again = load(lora_vllm, "dup", trained)
    assert again.status_code == 400
    assert again.json()["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in again.json()["error"]["message"]
    missing = load(lora_vllm, "missing", tmp_path / "nowhere")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "Loading lora missing failed: No adapter found for <path>"
    )
    wide = tmp_path / "wide"
    shutil.copytree(trained, wide)
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    refused = load(lora_vllm, "wide", wide)
    assert refused.status_code == 500, refused.text
    assert "LoRA rank 16 is greater than max_lora_rank 8." in refused.json()["error"]["message"]
    gone = lora_vllm.post("/v1/unload_lora_adapter", json={"lora_name": "dup"})
    assert gone.status_code == 200
    assert gone.text == "Success: LoRA adapter 'dup' removed successfully."
    again = lora_vllm.post("/v1/unload_lora_adapter", json={"lora_name": "dup"})
    assert again.status_code == 404 and "cannot be found" in again.json()["error"]["message"]


def test_a_level_one_sleep_and_wake_keep_the_adapter_answering(trained, lora_vllm):
    """What the simulator does without the adaptersLostAfterWake fault. On CPU vLLM's sleep
    frees nothing (docs/vllm-on-cpu.md), so this holds the API's side of it, not a GPU's."""
    manifest = manifest_read(trained)
    served = engine_name(NAME, 2)
    assert load(lora_vllm, served, trained).status_code == 200
    assert lora_vllm.post("/sleep", params={"level": 1}).status_code == 200
    assert lora_vllm.post("/wake_up").json()["status"] == "awake"
    assert served in [m["id"] for m in lora_vllm.get("/v1/models").json()["data"]]
    got = [chat(lora_vllm, served, e.prompt, e.max_tokens) for e in manifest.eval]
    assert got == [e.answer for e in manifest.eval]
