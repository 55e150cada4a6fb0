"""Config loading: strict, and every error names its JSON path and the rule broken."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from common.strict_json import ConfigError
from supervisor.config import (
    InferenceSlotConfig,
    TrainingSlotConfig,
    load_config,
    parse_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

VALID: dict[str, Any] = {
    "slots": [
        {
            "kind": "inference",
            "gpuIndex": 0,
            "models": [{"name": "qwen-small", "port": 8001}, {"name": "llama-small", "port": 8002}],
        },
        {
            "kind": "training",
            "gpuIndex": 0,
            "command": ["python", "train.py", "--lora"],
            "checkpointDir": "/ckpt",
        },
    ]
}


def errors_of(data: Any, cwd: Path = Path("/srv")) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, cwd=cwd)
    return info.value.errors


def with_changes(path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def test_the_original_config_shape_loads():
    config = parse_config(VALID, cwd=Path("/srv"))
    inference, training = config.slots
    assert isinstance(inference, InferenceSlotConfig)
    assert [(m.name, m.port, m.engine, m.managed) for m in inference.models] == [
        ("qwen-small", 8001, "vllm", False),
        ("llama-small", 8002, "vllm", False),
    ]
    assert isinstance(training, TrainingSlotConfig)
    assert training.command == ("python", "train.py", "--lora")
    assert training.grace_ms == 30_000
    assert config.gpu.backend == "nvml"


@pytest.mark.parametrize(
    "reference",
    ["./node_modules/@haru/protocol/schemas/supervisor-config.schema.json", "https://x/s.json"],
)
def test_an_original_config_naming_its_schema_loads_and_the_reference_is_ignored(
    tmp_path, reference
):
    # The original's configs may carry `$schema` for an editor; it says nothing to us.
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps({"$schema": reference, **VALID}))
    config = load_config(str(path), cwd=tmp_path)
    assert config == parse_config(VALID, cwd=tmp_path)
    assert errors_of({**VALID, "$schema": 1}) == ["$schema: must be a string, got a number"]
    nested = with_changes(["slots", 0, "$schema"], reference)
    assert errors_of(nested) == ["slots[0].$schema: is not a known field"]


def test_model_names_must_be_lowercase():
    data = with_changes(["slots", 0, "models", 1, "name"], "Llama-Small")
    assert errors_of(data) == ["slots[0].models[1].name: must be lowercase"]


def test_model_names_must_be_unique_on_the_host():
    data = copy.deepcopy(VALID)
    data["slots"].append(
        {"kind": "inference", "gpuIndex": 1, "models": [{"name": "qwen-small", "port": 8003}]}
    )
    assert errors_of(data) == [
        'slots[2].models[0].name: "qwen-small" is already used by slots[0].models[0]; '
        "model names must be unique on the host"
    ]


def test_gpu_index_and_kind_must_be_unique():
    data = copy.deepcopy(VALID)
    data["slots"].append(
        {"kind": "training", "gpuIndex": 0, "command": ["t"], "checkpointDir": "/c2"}
    )
    assert errors_of(data) == [
        "slots[2]: a training slot on GPU 0 is already declared at slots[1]; "
        "(gpuIndex, kind) must be unique"
    ]


RULES = [
    ([], {**VALID, "extra": 1}, "extra: is not a known field"),
    (["slots", 0, "color"], "red", "slots[0].color: is not a known field"),
    (["slots", 0, "models", 0, "weight"], 2, "slots[0].models[0].weight: is not a known field"),
    (["slots", 1, "env"], {}, "slots[1].env: is not a known field"),
    (
        ["slots", 0, "kind"],
        "serving",
        'slots[0].kind: must be "inference" or "training", got "serving"',
    ),
    (["slots", 0, "gpuIndex"], -1, "slots[0].gpuIndex: must be at least 0, got -1"),
    (["slots", 0, "gpuIndex"], "0", "slots[0].gpuIndex: must be an integer, got a string"),
    (["slots", 0, "gpuIndex"], True, "slots[0].gpuIndex: must be an integer, got a boolean"),
    (["slots", 0, "models"], [], "slots[0].models: must list at least one model"),
    (
        ["slots", 0, "models", 0, "port"],
        70000,
        "slots[0].models[0].port: must be at most 65535, got 70000",
    ),
    (
        ["slots", 0, "models", 0, "name"],
        "qwen small",
        "slots[0].models[0].name: must not contain whitespace",
    ),
    (
        ["slots", 0, "models", 0, "engine"],
        "llamacpp",
        'slots[0].models[0].engine: "llamacpp" cannot sleep over HTTP; give the model a '
        "profile so the supervisor can stop and start it",
    ),
    (["slots", 1, "command"], [], "slots[1].command: must not be empty"),
    (["slots", 1, "command"], "train", "slots[1].command: must be a list, got a string"),
    (["slots", 1, "graceMs"], 0, "slots[1].graceMs: must be at least 1, got 0"),
]


@pytest.mark.parametrize(("path", "value", "expected"), RULES)
def test_each_rule_names_its_path(path, value, expected):
    data = value if not path else with_changes(path, value)
    assert errors_of(data) == [expected]


def test_required_fields_are_named():
    errors = errors_of({"slots": [{"kind": "training", "gpuIndex": 0}]})
    assert errors == ["slots[0].command: is required", "slots[0].checkpointDir: is required"]
    assert errors_of({}) == ["slots: is required"]
    assert errors_of({"slots": []}) == ["slots: must be a non-empty list of slots"]


def test_two_models_cannot_share_a_port():
    data = with_changes(["slots", 0, "models", 1, "port"], 8001)
    assert errors_of(data) == [
        "slots[0].models[1].port: 8001 is already used by slots[0].models[0]"
    ]


def test_every_error_is_reported_not_just_the_first():
    # The structure (schemas/config.json) is checked first and every break of it is reported;
    # the semantic pass runs on a well-formed document and reports all of its own, too.
    data = copy.deepcopy(VALID)
    data["slots"][0]["models"][0]["port"] = 0
    data["slots"][1]["graceMs"] = -5
    data["bogus"] = True
    assert len(errors_of(data)) == 3
    data = copy.deepcopy(VALID)
    data["slots"][0]["models"][0]["name"] = "Qwen"
    data["slots"][0]["models"][1]["name"] = "Llama"
    data["slots"][0]["models"][1]["port"] = 8001
    assert errors_of(data) == [
        "slots[0].models[0].name: must be lowercase",
        "slots[0].models[1].name: must be lowercase",
    ]


def test_profile_errors_carry_the_model_path_and_the_profile_rule():
    data = with_changes(
        ["slots", 0, "models", 0, "profile"],
        {"engine": "vllm", "modelPath": "m", "tensorParallel": 2},
    )
    (error,) = errors_of(data)
    assert error.startswith('slots[0].models[0].profile: profile "qwen-small" (vllm): ')
    assert "TP x PP must equal nodes x GPUs per node" in error


def test_a_profile_must_run_on_its_slots_gpu():
    data = with_changes(
        ["slots", 0, "models", 0, "profile"], {"engine": "vllm", "modelPath": "m", "gpus": [1]}
    )
    assert errors_of(data) == [
        "slots[0].models[0].profile: runs on GPUs [1], which do not include the slot's GPU 0"
    ]


def test_model_engine_must_agree_with_its_profile():
    data = copy.deepcopy(VALID)
    data["slots"][0]["models"][0].update(engine="sglang", profile={"engine": "sim"})
    assert errors_of(data) == ['slots[0].models[0].engine: is "sglang" but the profile says "sim"']


def test_memory_fractions_of_servers_sharing_a_gpu_must_fit():
    data = copy.deepcopy(VALID)
    data["slots"][0]["models"][0]["profile"] = {
        "engine": "vllm",
        "modelPath": "a",
        "gpuMemoryUtilization": 0.6,
    }
    data["slots"][0]["models"][1]["profile"] = {
        "engine": "vllm",
        "modelPath": "b",
        "gpuMemoryUtilization": 0.5,
    }
    (error,) = errors_of(data)
    assert error.startswith(
        "slots: gpuMemoryUtilization of the servers sharing GPU 0 adds up to 1.10"
    )


def test_gpu_backend_rules():
    assert errors_of({**VALID, "gpu": {"backend": "cuda"}}) == [
        'gpu.backend: must be "nvml" or "sim", got "cuda"'
    ]
    assert errors_of({**VALID, "gpu": {"backend": "sim"}}) == [
        'gpu.simStateFile: is required for backend "sim"'
    ]
    assert errors_of({**VALID, "gpu": {"simStateFile": "x.json"}}) == [
        'gpu.simStateFile: is only for backend "sim"'
    ]
    sim = {"backend": "sim", "simStateFile": "s.json", "simGpus": [{"index": 1, "totalMiB": 100}]}
    errors = errors_of({**VALID, "gpu": sim})
    assert errors == [
        "slots[0].gpuIndex: GPU 0 is not one of the simulated GPUs (1)",
        "slots[1].gpuIndex: GPU 0 is not one of the simulated GPUs (1)",
    ]


def test_relative_paths_resolve_against_the_working_directory():
    data = copy.deepcopy(VALID)
    data["slots"][1]["checkpointDir"] = "var/east/checkpoints"
    data["gpu"] = {"backend": "sim", "simStateFile": "var/east/gpu.json"}
    config = parse_config(data, cwd=Path("/srv/haru"))
    assert config.training_slots[0].checkpoint_dir == Path("/srv/haru/var/east/checkpoints")
    assert config.gpu.sim_state_file == Path("/srv/haru/var/east/gpu.json")
    assert config.gpu.sim_gpus[0].total_mib == 81920


def test_config_loads_from_inline_json_or_a_file(tmp_path):
    inline = load_config(json.dumps(VALID), cwd=tmp_path)
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(VALID))
    from_file = load_config(str(path), cwd=Path("/"))
    relative = load_config("supervisor.json", cwd=tmp_path)
    assert inline == from_file == relative


def test_unreadable_or_malformed_sources_are_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config("missing.json", cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"inline JSON\) is not valid JSON"):
        load_config("{not json", cwd=tmp_path)


@pytest.mark.parametrize("name", ["supervisor-east.json", "supervisor-west.json"])
def test_example_configs_are_valid(name):
    config = load_config(str(REPO_ROOT / "examples" / name), cwd=REPO_ROOT)
    assert config.gpu.backend == "sim"
    assert sorted(m.name for m in config.models) == ["llama-small", "qwen-small"]
    assert all(m.managed and m.engine == "sim" and m.gpu_index == 0 for m in config.models)
    (training,) = config.training_slots
    assert training.gpu_index == 0
    assert training.command[1:3] == ("-m", "supervisor.sim.trainer")


def test_example_ports_match_the_two_domain_layout():
    east = load_config(str(REPO_ROOT / "examples/supervisor-east.json"), cwd=REPO_ROOT)
    west = load_config(str(REPO_ROOT / "examples/supervisor-west.json"), cwd=REPO_ROOT)
    assert {m.name: m.port for m in east.models} == {"qwen-small": 18001, "llama-small": 18002}
    assert {m.name: m.port for m in west.models} == {"qwen-small": 18011, "llama-small": 18012}
    assert east.gpu.sim_state_file != west.gpu.sim_state_file


def test_a_profile_structure_is_checked_by_the_config_schema_with_its_path():
    data = with_changes(
        ["slots", 0, "models", 1, "profile"],
        {"engine": "vllm", "gpus": [0, {"index": 1, "bogus": 1}], "env": {"A": 1}},
    )
    assert errors_of(data) == [
        "slots[0].models[1].profile.gpus[1].bogus: is not a known field",
        'slots[0].models[1].profile.env: value of "A" must be a string, got a number',
    ]
    # A null profile is no profile (an unmanaged server), not a type error.
    assert parse_config(with_changes(["slots", 0, "models", 1, "profile"], None), cwd=Path("/"))


def test_a_key_written_twice_in_the_config_file_is_refused_with_its_path(tmp_path):
    path = tmp_path / "supervisor.json"
    text = json.dumps(VALID).replace('"port": 8002', '"port": 8002, "port": 8003')
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), cwd=tmp_path)
    assert info.value.errors == [f"slots[0].models[1].port: duplicate key 'port' (in {path})"]
    with pytest.raises(ConfigError, match=r"^host: duplicate key 'host' \(in HARU_SUPERVISOR"):
        load_config('{"host": "a", "host": "b", "slots": []}', cwd=tmp_path)


def test_a_config_file_that_is_not_utf8_is_named_with_the_byte_and_line(tmp_path):
    path = tmp_path / "supervisor.json"
    path.write_bytes('{\n  "slots": [],\n  "note": "Café"\n}'.encode("latin-1"))
    with pytest.raises(ConfigError) as refused:
        load_config(str(path), cwd=tmp_path)
    assert refused.value.errors == [
        f"(root): config file {path} is not UTF-8 (byte 0xe9 on line 3); save it as UTF-8"
    ]
