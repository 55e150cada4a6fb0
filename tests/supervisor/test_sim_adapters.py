"""The simulated trainer's adapters and the simulated engine's runtime LoRA endpoints together:
what the trainer records is what the engine answers, and the faults Haru must catch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from common.adapter_manifest import engine_name, files_verify, manifest_read
from supervisor.sim import trainer
from supervisor.sim.__main__ import parse_args
from supervisor.sim.engine import SimEngine, build_app

MODEL = "tiny"
NAME = "support-bot"


def train(tmp_path: Path, monkeypatch, *extra: str, steps: int = 3) -> Path:
    """Run the simulated trainer to its end; return the adapter it published last."""
    monkeypatch.setenv("HARU_CHECKPOINT_DIR", str(tmp_path))
    code = trainer.main(
        [
            "--step-s", "0.001", "--max-steps", str(steps), "--adapter-name", NAME,
            "--served-model", MODEL, *extra,
        ]
    )  # fmt: skip
    assert code == 0
    return sorted(tmp_path.glob("adapter-*"))[-1]


def engine_client(*args: str, runtime: bool = True, monkeypatch=None) -> TestClient:
    if monkeypatch is not None:
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1" if runtime else "0")
    options, _ = parse_args(["--port", "1", "--model", MODEL, *args])
    app = build_app(SimEngine(options))
    # Loopback, so the /_sim/ controls answer.
    return TestClient(app, client=("127.0.0.1", 50000))


def chat(c: TestClient, model: str, prompt: str, max_tokens: int, *, stream: bool = False) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1337,
        "stream": stream,
    }
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def load(c: TestClient, name: str, path: Path | str, **extra):
    return c.post(
        "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra}
    )


@pytest.fixture
def lora_engine(monkeypatch):
    with engine_client("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                       monkeypatch=monkeypatch) as c:  # fmt: skip
        yield c


def test_the_trainer_publishes_a_complete_manifested_adapter(tmp_path, monkeypatch):
    adapter = train(tmp_path, monkeypatch)
    manifest = manifest_read(adapter)
    assert manifest.name == NAME and manifest.base_model == MODEL and manifest.rank == 8
    assert files_verify(adapter, manifest) is None
    assert {f.path for f in manifest.files} == {"adapter_config.json", "adapter_model.safetensors"}
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["target_modules"] == ["q_proj", "v_proj"] and "haru_sim" not in config
    assert len(manifest.eval) == 3 and manifest.distinguishable()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing torn left
    # The resumable checkpoints the trainer always wrote are still there.
    assert (tmp_path / "step-000003.json").is_file()


def test_the_engine_answers_exactly_what_the_trainer_recorded(tmp_path, monkeypatch, lora_engine):
    adapter = train(tmp_path, monkeypatch, "--eval-prompt", "Hi there", "--eval-prompt", "¿Qué?")
    manifest = manifest_read(adapter)
    served = engine_name(NAME, 1)
    r = load(lora_engine, served, adapter)
    assert r.status_code == 200
    assert r.text == f"Success: LoRA adapter '{served}' added successfully."
    for e in manifest.eval:
        assert chat(lora_engine, served, e.prompt, e.max_tokens) == e.answer
        assert chat(lora_engine, served, e.prompt, e.max_tokens, stream=True) == e.answer
        assert chat(lora_engine, MODEL, e.prompt, e.max_tokens) == e.base_answer
        # max_tokens is honoured: fewer tokens, a prefix of the answer.
        assert chat(lora_engine, served, e.prompt, 2) == " ".join(e.answer.split()[:2])
    models = lora_engine.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in models] == [
        (MODEL, None, MODEL),
        (served, MODEL, str(adapter)),
    ]


def test_another_version_answers_differently(tmp_path, monkeypatch, lora_engine):
    one = manifest_read(train(tmp_path / "a", monkeypatch, steps=3))
    two = manifest_read(train(tmp_path / "b", monkeypatch, steps=4))
    assert one.digest != two.digest
    assert [e.answer for e in one.eval] != [e.answer for e in two.eval]


def test_load_and_unload_answer_as_vllm_does(tmp_path, monkeypatch, lora_engine):
    adapter = train(tmp_path, monkeypatch)
    assert load(lora_engine, "x", adapter).status_code == 200
    again = load(lora_engine, "x", adapter)
    assert again.status_code == 400
    assert again.json()["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in again.json()["error"]["message"]
    assert load(lora_engine, "x", adapter, load_inplace=True).status_code == 200
    conflict = load(lora_engine, MODEL, adapter)
    assert conflict.status_code == 400 and "conflicts with a served base model" in conflict.text
    missing = load(lora_engine, "y", tmp_path / "nowhere")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "Loading lora y failed: No adapter found for <path>"
    )
    assert load(lora_engine, "", adapter).status_code == 400
    r = lora_engine.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'x' removed successfully."
    gone = lora_engine.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert gone.status_code == 404 and "cannot be found" in gone.text
    unknown = lora_engine.post(
        "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "q"}]},
    )
    assert unknown.status_code == 404


def test_a_rank_over_max_lora_rank_or_a_config_without_tensors_is_refused(
    tmp_path, monkeypatch, lora_engine
):
    adapter = train(tmp_path, monkeypatch)
    wide = tmp_path / "wide"
    shutil.copytree(adapter, wide)
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    r = load(lora_engine, "wide", wide)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "LoRA rank 16 is greater than max_lora_rank 8."
    (wide / "adapter_config.json").write_text(json.dumps(config))
    (wide / "adapter_model.safetensors").unlink()
    r = load(lora_engine, "wide", wide)
    assert r.status_code == 500 and "doesn't contain tensors" in r.text
    assert [m["id"] for m in lora_engine.get("/v1/models").json()["data"]] == [MODEL]


def test_the_routes_exist_only_with_runtime_updating_and_load_only_with_enable_lora(
    tmp_path, monkeypatch
):
    adapter = train(tmp_path, monkeypatch)
    with engine_client("--enable-lora", runtime=False, monkeypatch=monkeypatch) as c:
        assert load(c, "x", adapter).status_code == 404
    with engine_client(monkeypatch=monkeypatch) as c:
        r = load(c, "x", adapter)
        assert r.status_code == 500 and "--enable-lora" in r.text


def test_adapter_noop_loads_lists_and_answers_as_the_base(tmp_path, monkeypatch, lora_engine):
    manifest = manifest_read(adapter := train(tmp_path, monkeypatch))
    assert lora_engine.post("/_sim/faults", json={"adapterNoop": True}).status_code == 200
    assert load(lora_engine, "x", adapter).status_code == 200
    assert "x" in [m["id"] for m in lora_engine.get("/v1/models").json()["data"]]
    e = manifest.eval[0]
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.base_answer
    # Clearing the fault does not heal what loaded under it; a reload does.
    lora_engine.post("/_sim/faults", json={"adapterNoop": False})
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.base_answer
    assert load(lora_engine, "x", adapter, load_inplace=True).status_code == 200
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.answer


def test_a_wake_keeps_adapters_unless_the_lost_fault_drops_them(tmp_path, monkeypatch, lora_engine):
    manifest = manifest_read(adapter := train(tmp_path, monkeypatch))
    e = manifest.eval[0]
    assert load(lora_engine, "x", adapter).status_code == 200
    assert lora_engine.post("/sleep?level=1").status_code == 200
    assert lora_engine.post("/wake_up").status_code == 200
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.answer
    lora_engine.post("/_sim/faults", json={"adaptersLostAfterWake": True})
    lora_engine.post("/sleep?level=1")
    lora_engine.post("/wake_up")
    # vLLM #53888: still listed, silently answering as the base model.
    assert "x" in [m["id"] for m in lora_engine.get("/v1/models").json()["data"]]
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.base_answer
    lora_engine.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
    assert load(lora_engine, "x", adapter).status_code == 200
    assert chat(lora_engine, "x", e.prompt, e.max_tokens) == e.answer


def test_a_bad_version_passes_its_first_probe_then_fails_at_runtime(
    tmp_path, monkeypatch, lora_engine
):
    adapter = train(tmp_path, monkeypatch, "--bad", "--bad-error-rate", "0.5")
    manifest = manifest_read(adapter)
    assert manifest.training["simBad"] is True
    e = manifest.eval[0]
    assert load(lora_engine, "bad", adapter).status_code == 200
    body = {"model": "bad", "messages": [{"role": "user", "content": e.prompt}],
            "max_tokens": e.max_tokens, "temperature": 0}  # fmt: skip
    codes = [lora_engine.post("/v1/chat/completions", json=body).status_code for _ in range(6)]
    assert codes == [200, 500, 200, 500, 200, 500]
    assert chat(lora_engine, MODEL, e.prompt, e.max_tokens) == e.base_answer  # the base is fine


def test_bad_versions_flags_only_the_versions_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HARU_CHECKPOINT_DIR", str(tmp_path))
    args = trainer.parse_args(
        ["--adapter-name", NAME, "--served-model", MODEL, "--bad-versions", "2"]
    )
    plan = args.adapter_plan
    flags = []
    for version in (1, 2, 3):
        path = trainer.publish_adapter(tmp_path, version * 10, plan, version=version, now=0.0)
        flags.append("haru_sim" in json.loads((path / "adapter_config.json").read_text()))
    assert flags == [False, True, False]


def test_an_evicted_adapter_is_read_again_from_its_path(tmp_path, monkeypatch):
    one = train(tmp_path / "a", monkeypatch, steps=3)
    two = train(tmp_path / "b", monkeypatch, steps=4)
    with engine_client("--enable-lora", "--max-loras", "1", monkeypatch=monkeypatch) as c:
        assert load(c, "one", one).status_code == 200
        assert load(c, "two", two).status_code == 200  # one is evicted from the cache
        e1, e2 = manifest_read(one).eval[0], manifest_read(two).eval[0]
        assert chat(c, "one", e1.prompt, e1.max_tokens) == e1.answer
        shutil.rmtree(two)  # evicted now, and gone from disk
        r = c.post("/v1/chat/completions", json={"model": "two", "messages": [
            {"role": "user", "content": e2.prompt}]})  # fmt: skip
        assert r.status_code == 404 and "No adapter found" in r.text


def test_adapter_flags_are_validated(tmp_path, monkeypatch):
    for argv in (
        ["--served-model", MODEL],
        ["--adapter-name", NAME],
        ["--adapter-name", "Bad@Name", "--served-model", MODEL],
        ["--adapter-name", NAME, "--served-model", MODEL, "--bad-versions", "x"],
        ["--adapter-name", NAME, "--served-model", MODEL, "--eval-max-tokens", "0"],
    ):
        with pytest.raises(SystemExit):
            trainer.parse_args(argv)
    with pytest.raises(SystemExit):
        parse_args(["--port", "1", "--model", MODEL, "--max-loras", "2", "--max-cpu-loras", "1"])


def test_a_publish_that_dies_before_its_manifest_leaves_nothing_that_looks_complete(
    tmp_path, monkeypatch
):
    plan = trainer.parse_args(["--adapter-name", NAME, "--served-model", MODEL]).adapter_plan

    def crash(directory, manifest):
        raise OSError("disk full")

    monkeypatch.setattr(trainer, "manifest_write", crash)
    with pytest.raises(OSError):
        trainer.publish_adapter(tmp_path, 7, plan, version=1, now=0.0)
    assert not list(tmp_path.glob("adapter-*"))
    (torn,) = [p for p in tmp_path.iterdir() if p.name.startswith(".adapter-")]
    assert not (torn / "haru-adapter.json").exists()


def test_only_the_newest_adapters_are_kept(tmp_path):
    plan = trainer.parse_args(["--adapter-name", NAME, "--served-model", MODEL]).adapter_plan
    for step in range(1, trainer.KEEP_ADAPTERS + 3):
        trainer.publish_adapter(tmp_path, step, plan, version=step, now=0.0)
    kept = sorted(p.name for p in tmp_path.glob("adapter-*"))
    assert kept == [f"adapter-{s:06d}" for s in range(3, trainer.KEEP_ADAPTERS + 3)]
