"""Profile validation: each rule refuses with a message naming the profile and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.engines.profile import EngineProfile, GpuSpec, parse_profile
from supervisor.engines.registry import default_registry

REGISTRY = default_registry()


def parse(model: str = "qwen-small", **fields: Any) -> EngineProfile:
    errors: list[str] = []
    profile = parse_profile(
        fields,
        "profile",
        errors,
        model_name=model,
        default_gpu_index=0,
        engine_names=REGISTRY.names(),
    )
    assert not errors, errors
    assert profile is not None
    return profile


def problems(facts: dict[int, GpuSpec] | None = None, **fields: Any) -> list[str]:
    profile = parse(**fields)
    return REGISTRY.get(profile.engine).validate(profile, facts or {})


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


def test_a_sound_profile_has_no_problems():
    assert problems(engine="vllm", modelPath="m", tensorParallel=2, gpus=[0, 1]) == []


def test_tp_times_pp_must_equal_nodes_times_gpus_per_node():
    message = only(problems(engine="vllm", modelPath="m", tensorParallel=2, gpus=[0]))
    assert message.startswith('profile "qwen-small" (vllm): ')
    assert "tensorParallel 2 x pipelineParallel 1 = 2 GPUs" in message
    assert "nodes 1 x gpusPerNode 1 = 1" in message


def test_multi_node_layout_counts_every_node():
    found = problems(
        engine="vllm",
        modelPath="m",
        tensorParallel=4,
        pipelineParallel=2,
        nodes=2,
        gpus=[0, 1],
        leaderAddr="10.0.0.1",
        leaderPort=29500,
        managementInterface="eth0",
    )
    assert "must equal nodes x GPUs per node" in only(found)


def test_listed_gpus_must_match_gpus_per_node():
    found = problems(engine="vllm", modelPath="m", gpus=[0, 1], gpusPerNode=1)
    assert any("lists 2 GPUs on this node but gpusPerNode is 1" in p for p in found)


def test_tensor_parallel_group_may_not_mix_gpu_types_declared():
    message = only(
        problems(
            engine="vllm",
            modelPath="m",
            tensorParallel=2,
            gpus=[{"index": 0, "type": "H100"}, {"index": 1, "type": "A100"}],
        )
    )
    assert "may not mix GPU types" in message
    assert "GPU 0 is H100" in message and "GPU 1 is A100" in message


def test_tensor_parallel_group_may_not_mix_gpu_types_reported_by_hardware():
    facts = {0: GpuSpec(0, "NVIDIA H100 80GB HBM3", "9.0"), 1: GpuSpec(1, "NVIDIA L4", "8.9")}
    found = problems(facts, engine="sglang", modelPath="m", tensorParallel=2, gpus=[0, 1])
    assert "may not mix GPU types" in only(found)


def test_fp8_needs_compute_capability_8_9():
    message = only(
        problems(
            engine="vllm",
            modelPath="m",
            quantization="fp8",
            gpus=[{"index": 0, "type": "A100", "computeCapability": "8.0"}],
        )
    )
    assert message == (
        'profile "qwen-small" (vllm): quantization fp8 needs compute capability 8.9 or newer, '
        "GPU 0 (A100) has 8.0"
    )


def test_fp8_runs_on_ada_and_hopper():
    for cc in ("8.9", "9.0", "10.0"):
        gpus = [{"index": 0, "computeCapability": cc}]
        assert problems(engine="vllm", modelPath="m", quantization="fp8", gpus=gpus) == []


def test_quantization_in_extra_args_is_checked_too():
    facts = {0: GpuSpec(0, "Tesla T4", "7.5")}
    found = problems(facts, engine="vllm", modelPath="m", extraArgs=["--quantization=fp8"])
    assert "quantization fp8 needs compute capability 8.9" in only(found)


def test_unknown_compute_capability_is_let_through():
    assert problems(engine="vllm", modelPath="m", quantization="fp8") == []


def test_quantization_may_be_set_only_once():
    found = problems(
        engine="vllm", modelPath="m", quantization="awq", extraArgs=["--quantization", "awq"]
    )
    assert "sets quantization both as a field and in extraArgs" in only(found)


def test_model_path_is_required_for_real_engines():
    assert "modelPath is required" in only(problems(engine="vllm"))
    assert problems(engine="sim") == []


def test_multi_node_needs_a_leader_and_a_management_interface():
    found = problems(
        engine="vllm", modelPath="m", tensorParallel=2, pipelineParallel=2, nodes=2, gpus=[0, 1]
    )
    assert any("needs leaderAddr and leaderPort" in p for p in found)
    assert any("needs managementInterface" in p for p in found)


def test_node_rank_must_be_inside_the_group():
    found = problems(engine="vllm", modelPath="m", nodeRank=1)
    assert "nodeRank 1 is outside 0..0" in only(found)


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        ("vllm", "--host"),
        ("vllm", "--port"),
        ("vllm", "--served-model-name"),
        ("vllm", "--tensor-parallel-size"),
        ("sglang", "--host"),
        ("sglang", "--mem-fraction-static"),
        ("llamacpp", "--port"),
        ("sim", "--model"),
    ],
)
def test_extra_args_may_not_override_what_the_supervisor_sets(engine, flag):
    found = problems(engine=engine, modelPath="/m", extraArgs=[f"{flag}=x"])
    assert f"extraArgs may not set {flag}; the supervisor sets it" in only(found)


def test_llamacpp_runs_on_one_node_only():
    found = problems(
        engine="llamacpp",
        modelPath="/m.gguf",
        tensorParallel=2,
        nodes=2,
        gpus=[0],
        leaderAddr="10.0.0.1",
        leaderPort=1,
        managementInterface="eth0",
    )
    assert any("llama.cpp runs on one node" in p for p in found)


def test_llamacpp_cannot_split_by_rows_and_layers_at_once():
    found = problems(
        engine="llamacpp", modelPath="/m", tensorParallel=2, pipelineParallel=2, gpus=[0, 1, 2, 3]
    )
    assert "not both" in only(found)


def test_llamacpp_refuses_quantization_and_memory_fraction():
    assert "from the GGUF file" in only(
        problems(engine="llamacpp", modelPath="/m", quantization="fp8")
    )
    found = problems(engine="llamacpp", modelPath="/m", gpuMemoryUtilization=0.5)
    assert "no memory fraction" in only(found)


def test_sim_runs_on_one_node_only():
    found = problems(
        engine="sim",
        tensorParallel=2,
        nodes=2,
        gpus=[0],
        leaderAddr="h",
        leaderPort=1,
        managementInterface="eth0",
    )
    assert any("simulated engine runs on one node" in p for p in found)


def test_shape_errors_name_the_json_path():
    errors: list[str] = []
    result = parse_profile(
        {
            "engine": "tgi",
            "tensorParallel": 0,
            "gpus": [0, 0, {"index": 1, "computeCapability": "nine"}],
            "fabric": {"name": "ib", "hcas": []},
            "gpuMemoryUtilization": 1.5,
            "servedModelName": "other",
            "env": {"A": 1},
            "bogus": True,
        },
        "slots[0].models[0].profile",
        errors,
        model_name="qwen-small",
        default_gpu_index=0,
        engine_names=REGISTRY.names(),
    )
    assert result is None
    p = "slots[0].models[0].profile"
    expected = [
        f'{p}.engine: unknown engine "tgi" (known: llamacpp, sglang, sim, vllm)',
        f'{p}.servedModelName: must equal the model name "qwen-small", got "other"',
        f"{p}.tensorParallel: must be at least 1, got 0",
        f"{p}.gpus[1]: GPU 0 is listed twice",
        f"{p}.gpus[2].computeCapability: must look like \"8.9\", got 'nine'",
        f"{p}.fabric.hcas: must list at least one adapter",
        f"{p}.gpuMemoryUtilization: must be in (0, 1], got 1.5",
        f'{p}.env: value of "A" must be a string, got a number',
        f"{p}.bogus: is not a known field",
    ]
    for line in expected:
        assert line in errors, (line, errors)


def shape_errors(profile: Any, model_name: str = "qwen-small") -> list[str]:
    errors: list[str] = []
    result = parse_profile(
        profile,
        "p",
        errors,
        model_name=model_name,
        default_gpu_index=0,
        engine_names=REGISTRY.names(),
    )
    assert (result is None) == bool(errors)
    return errors


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("vllm", "p: must be an object, got a string"),
        ({}, "p.engine: is required"),
        (
            {"engine": "vllm", "tensorParallel": 1025},
            "p.tensorParallel: must be at most 1024, got 1025",
        ),
        ({"engine": "vllm", "nodes": True}, "p.nodes: must be an integer, got a boolean"),
        ({"engine": "vllm", "nodeRank": 5000}, "p.nodeRank: must be at most 1024, got 5000"),
        ({"engine": "vllm", "leaderPort": 70000}, "p.leaderPort: must be at most 65535, got 70000"),
        ({"engine": "vllm", "gpus": []}, "p.gpus: must be a non-empty list, got an empty list"),
        ({"engine": "vllm", "gpus": "0"}, "p.gpus: must be a non-empty list, got a string"),
        ({"engine": "vllm", "gpus": [-1]}, "p.gpus[0]: GPU index must be at least 0, got -1"),
        ({"engine": "vllm", "gpus": [1024]}, "p.gpus[0]: GPU index must be at most 1023, got 1024"),
        (
            {"engine": "vllm", "gpus": ["0"]},
            "p.gpus[0]: must be a GPU index or an object, got a string",
        ),
        ({"engine": "vllm", "gpus": [{"type": "H100"}]}, "p.gpus[0].index: is required"),
        (
            {"engine": "vllm", "gpus": [{"index": 0, "uuid": "x"}]},
            "p.gpus[0].uuid: is not a known field",
        ),
        (
            {"engine": "vllm", "gpus": [{"index": 0, "computeCapability": [8]}]},
            'p.gpus[0].computeCapability: must look like "8.9", got a list',
        ),
        ({"engine": "vllm", "fabric": {"name": "ib"}}, "p.fabric.hcas: is required"),
        (
            {"engine": "vllm", "fabric": {"name": "ib", "hcas": [""]}},
            "p.fabric.hcas[0]: must not be empty",
        ),
        (
            {"engine": "vllm", "managementInterface": "eth 0"},
            'p.managementInterface: "eth 0" is not a network interface name',
        ),
        (
            {"engine": "vllm", "gpuMemoryUtilization": 0},
            "p.gpuMemoryUtilization: must be in (0, 1], got 0",
        ),
        (
            {"engine": "vllm", "extraArgs": ["--x", 3]},
            "p.extraArgs[1]: must be a string, got a number",
        ),
        (
            {"engine": "vllm", "extraArgs": ["--x"] * 1025},
            "p.extraArgs: must list at most 1024 arguments",
        ),
        ({"engine": "vllm", "env": {"": "x"}}, "p.env: keys must not be empty"),
        ({"engine": "vllm", "env": []}, "p.env: must be an object, got a list"),
        ({"engine": "vllm", "modelPath": "  "}, "p.modelPath: must not be empty"),
        (
            {"engine": "vllm", "sleepMode": "deep"},
            'p.sleepMode: must be one of native, api-only, got "deep"',
        ),
        ({"engine": "vllm", "entrypoint": 1}, "p.entrypoint: must be a string, got a number"),
    ],
)
def test_the_profile_schema_refuses_with_the_field_path(profile, expected):
    assert expected in shape_errors(profile)


def test_schema_and_semantic_rules_are_reported_together():
    # The semantic pass runs beside the schema: an operator fixes everything in one round.
    errors = shape_errors({"engine": "tgi", "servedModelName": "x", "nodes": 0})
    assert errors == [
        "p.nodes: must be at least 1, got 0",
        'p.engine: unknown engine "tgi" (known: llamacpp, sglang, sim, vllm)',
        'p.servedModelName: must equal the model name "qwen-small", got "x"',
    ]


def test_a_valid_profile_fills_defaults_and_reads_gpu_facts():
    errors: list[str] = []
    profile = parse_profile(
        {
            "engine": "vllm",
            "quantization": "AWQ",
            "fabric": None,
            "gpus": [2, {"index": 3, "type": "H100", "computeCapability": 9}],
        },
        "p",
        errors,
        model_name="m",
        default_gpu_index=0,
        engine_names=REGISTRY.names(),
    )
    assert errors == []
    assert profile is not None
    assert profile.gpus == (GpuSpec(2), GpuSpec(3, "H100", "9.0"))
    assert (profile.name, profile.served_model_name, profile.quantization) == ("m", "m", "awq")
    assert (profile.tensor_parallel, profile.nodes, profile.fabric) == (1, 1, None)
