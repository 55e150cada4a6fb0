"""The bench's real-engine host (haru/local/vllm_hosts.py): a supervisor whose vLLM has runtime
LoRA and whose training slot runs the torch trainer. Its trainer's adapter reaches the
supervisor's store, loads on the real vLLM as `NAME@v1` through the supervisor's adapter API,
answers the manifest's evaluation answers exactly, and stays loaded across an api-only sleep and
wake (docs/adapters.md). The first test checks the host's config without starting anything."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from common.adapter_manifest import engine_name, manifest_read
from fleets.layouts.loader import parse_layout
from haru.local.layouts import fleet_layout
from haru.local.processes import wait_for
from haru.local.vllm_hosts import (
    LORA,
    TORCH_PYTHON,
    VllmHost,
    torch_trainer,
    vllm_environment,
)
from supervisor.config import parse_config
from supervisor.sim.trainer import DEFAULT_EVAL_PROMPTS
from tests.realengine.conftest import MODEL

NAME = "support-bot"
# Where the trainer's answers read as its corpus's (measured: about 9 s alone, --threads 1).
STEPS = 200


def test_a_vllm_host_config_is_one_the_supervisor_accepts(tmp_path):
    host = VllmHost(
        "east",
        tmp_path,
        vllm_python=Path("/venv/bin/python"),
        torch_python=Path("/torch/bin/python"),
        model_dir=tmp_path / "model",
    )
    config = parse_config(host.config, cwd=tmp_path)
    (server,) = config.slots[0].models  # type: ignore[union-attr]
    assert server.name == MODEL and server.port == host.model_ports[MODEL]
    profile = host.config["slots"][0]["models"][0]["profile"]
    assert profile["lora"] == LORA and profile["sleepMode"] == "api-only"
    command = config.slots[1].command  # type: ignore[union-attr]
    assert command[:2] == ("/torch/bin/python", "-m")
    assert command[command.index("--threads") + 1] == "1"
    assert command[command.index("--base-model-dir") + 1] == str(tmp_path / "model")
    domain = host.layout_domain(10, "vllm")
    assert domain["slots"][0]["models"][0]["profile"] == profile
    assert domain["servingBaseUrl"] == host.engine_url
    west = VllmHost(
        "west",
        tmp_path,
        vllm_python=Path("/venv/bin/python"),
        torch_python=Path("/torch/bin/python"),
        model_dir=tmp_path / "model",
        start_asleep=True,
        trainer_args=("--publish-every-steps", "50"),
    )
    # Given again after the defaults: the trainer's argparse keeps the last.
    west_command = west.config["slots"][1]["command"]
    assert west_command[-2:] == ["--publish-every-steps", "50"]
    assert west_command.count("--publish-every-steps") == 2
    # The control plane takes the hosts' profiles as the bindings' own (nothing drifted).
    layout = parse_layout(fleet_layout(host, west))  # type: ignore[arg-type]
    bound = {d.slug: d.slots[0].models[0].profile for d in layout.domains}
    assert bound == {"east": profile, "west": profile}
    with pytest.raises(ValueError, match="runs vLLM"):
        host.layout_domain(10, "sim")


@pytest.mark.realengine
def test_a_trained_adapter_loads_answers_and_survives_sleep(vllm_python, tiny_model, tmp_path):
    found = vllm_environment()
    if isinstance(found, str):
        pytest.fail(found)
    assert found == (vllm_python, TORCH_PYTHON)
    trainer = torch_trainer(
        TORCH_PYTHON,
        tiny_model,
        "--max-steps",
        str(STEPS),
        model=MODEL,
        adapter_name=NAME,
        publish_every_steps=STEPS,
        min_step_s=0,
    )
    host = VllmHost(
        "east",
        tmp_path,
        vllm_python=vllm_python,
        torch_python=TORCH_PYTHON,
        model_dir=tiny_model,
        trainer_command=trainer,
    )
    try:
        began = time.monotonic()
        host.start()
        started_s = time.monotonic() - began
        assert host.asleep() == {MODEL: False}
        host.post("/v1/training/start")
        checkpoint = tmp_path / "east" / "checkpoints" / f"adapter-{STEPS:06d}"
        wait_for(lambda: (checkpoint / "haru-adapter.json").is_file(), 180, "the adapter", every=1)
        trained_s = time.monotonic() - began - started_s
        manifest = manifest_read(checkpoint)
        assert [e.prompt for e in manifest.eval] == list(DEFAULT_EVAL_PROMPTS)
        assert manifest.distinguishable(), manifest.eval

        listed = host.get("/v1/adapters")
        (stored,) = listed["adapters"]
        assert stored["id"] == manifest.store_id and stored["digest"] == manifest.digest
        assert stored["origin"] == "trained" and stored["manifest"]["name"] == NAME
        assert listed["loaded"] == []

        served = engine_name(NAME, 1)
        loading = time.monotonic()
        loaded = host.post(
            "/v1/adapters/load", {"model": MODEL, "name": served, "id": stored["id"]}
        )
        assert loaded == {"model": MODEL, "name": served, "loaded": True}
        answers = [host.chat(served, e.prompt, e.max_tokens) for e in manifest.eval]
        answered_s = time.monotonic() - loading
        assert answers == [e.answer for e in manifest.eval]
        bases = [host.chat(MODEL, e.prompt, e.max_tokens) for e in manifest.eval]
        assert bases == [e.base_answer for e in manifest.eval]

        host.post("/v1/vllm/sleep")
        assert host.asleep() == {MODEL: True}
        host.post("/v1/vllm/wake")
        assert host.asleep() == {MODEL: False}
        wanted = {"model": MODEL, "name": served, "id": stored["id"]}
        assert wanted in host.get("/v1/adapters")["loaded"]
        again = [host.chat(served, e.prompt, e.max_tokens) for e in manifest.eval]
        assert again == [e.answer for e in manifest.eval]
        print(
            f"REALENGINE FIGURE vllm host: started in {started_s:.1f} s, "
            f"{STEPS} steps trained and published in {trained_s:.1f} s, "
            f"loaded and its {len(answers)} evaluation prompts answered in {answered_s:.1f} s"
        )
    finally:
        host.stop()
