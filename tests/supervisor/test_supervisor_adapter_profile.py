"""A profile's `lora`: runtime LoRA loading turned on, as vLLM 0.32 (and the simulator) take it."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.engines.launch import LaunchContext
from supervisor.engines.profile import EngineProfile, parse_profile
from supervisor.engines.registry import default_registry

REGISTRY = default_registry()
LORA = {"maxLoras": 2, "maxLoraRank": 16}


def parsed(**fields: Any) -> tuple[EngineProfile | None, list[str]]:
    errors: list[str] = []
    profile = parse_profile(
        fields,
        "profile",
        errors,
        model_name="tiny",
        default_gpu_index=0,
        engine_names=REGISTRY.names(),
    )
    if profile is not None:
        errors += REGISTRY.get(profile.engine).validate(profile, {})
    return profile, errors


def build(profile: EngineProfile):
    ctx = LaunchContext(port=8001, environ={"PATH": "/usr/bin"}, servers_sharing_gpu=1)
    return REGISTRY.get(profile.engine).build(profile, ctx)


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_lora_turns_on_runtime_loading_with_the_engines_flags_and_variable(engine):
    profile, errors = parsed(engine=engine, modelPath="/models/tiny", lora=LORA)
    assert errors == [] and profile is not None
    launch = build(profile)
    argv = list(launch.argv)
    at = argv.index("--enable-lora")
    assert argv[at : at + 5] == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"]
    assert launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_without_lora_nothing_is_added_and_the_fingerprint_is_unchanged():
    plain, _ = parsed(engine="vllm", modelPath="/models/tiny")
    with_lora, _ = parsed(engine="vllm", modelPath="/models/tiny", lora=LORA)
    assert plain is not None and with_lora is not None
    launch = build(plain)
    assert "--enable-lora" not in launch.argv
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in launch.env
    assert "lora" not in plain.canonical()
    # Turning it on is a profile change (a swap restarts the server with it).
    assert build(with_lora).fingerprint != launch.fingerprint


@pytest.mark.parametrize(
    ("lora", "says"),
    [
        ({"maxLoras": 1, "maxLoraRank": 8}, "profile.lora.maxLoras: must be at least 2"),
        ({"maxLoras": 2, "maxLoraRank": 7}, "profile.lora.maxLoraRank: must be one of vLLM's"),
        ({"maxLoras": 2}, "must give maxLoras and maxLoraRank"),
        ({"maxLoras": 2, "maxLoraRank": 8, "x": 1}, "is not a known field"),
        ("yes", "must be an object"),
    ],
)
def test_a_bad_lora_is_refused_with_the_field_named(lora, says):
    profile, errors = parsed(engine="vllm", modelPath="/models/tiny", lora=lora)
    assert profile is None
    assert any(says in e for e in errors), errors


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_an_engine_without_runtime_lora_refuses_the_key(engine):
    _, errors = parsed(engine=engine, modelPath="/models/tiny", lora=LORA)
    assert any("cannot load LoRA adapters at runtime" in e for e in errors), errors


def test_the_lora_flags_are_the_supervisors_own():
    _, errors = parsed(engine="vllm", modelPath="/models/tiny", extraArgs=["--max-loras", "4"])
    assert any("--max-loras" in e for e in errors), errors
