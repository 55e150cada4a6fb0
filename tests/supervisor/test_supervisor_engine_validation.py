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
