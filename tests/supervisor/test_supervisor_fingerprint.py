"""Profile fingerprints: stable, sensitive to what affects a launch, unknown never matches."""

from __future__ import annotations

from typing import Any

from fleets.dashboard.drift import DRIFT, MATCH, UNKNOWN, drift_status, expected_fingerprint
from supervisor.engines.fingerprint import profile_fingerprint
from supervisor.engines.profile import parse_profile
from supervisor.engines.registry import default_registry


def fp(model: str = "qwen-small", **fields: Any) -> str:
    errors: list[str] = []
    profile = parse_profile(
        fields,
        "p",
        errors,
        model_name=model,
        default_gpu_index=0,
        engine_names=default_registry().names(),
    )
    assert profile is not None, errors
    return profile_fingerprint(profile)


def test_fingerprint_is_a_stable_sha256():
    value = fp(engine="vllm", modelPath="m")
    assert value.startswith("sha256:") and len(value) == len("sha256:") + 64
    assert value == fp(engine="vllm", modelPath="m")


def test_explicit_defaults_hash_like_omitted_ones():
    assert fp(engine="vllm", modelPath="m") == fp(
        engine="vllm",
        modelPath="m",
        tensorParallel=1,
        pipelineParallel=1,
        nodes=1,
        gpus=[0],
        extraArgs=[],
        env={},
    )


def test_key_order_of_env_does_not_matter():
    a = fp(engine="vllm", modelPath="m", env={"A": "1", "B": "2"})
    b = fp(engine="vllm", modelPath="m", env={"B": "2", "A": "1"})
    assert a == b


def test_everything_that_affects_the_launch_changes_it():
    base = fp(engine="vllm", modelPath="m")
    variants = [
        fp(engine="sglang", modelPath="m"),
        fp(engine="vllm", modelPath="m2"),
        fp(model="other", engine="vllm", modelPath="m"),
        fp(engine="vllm", modelPath="m", tensorParallel=2, gpus=[0, 1]),
        fp(engine="vllm", modelPath="m", gpus=[1]),
        fp(engine="vllm", modelPath="m", quantization="fp8"),
        fp(engine="vllm", modelPath="m", gpuMemoryUtilization=0.5),
        fp(engine="vllm", modelPath="m", extraArgs=["--max-model-len", "4096"]),
        fp(engine="vllm", modelPath="m", env={"X": "1"}),
        fp(engine="vllm", modelPath="m", fabric={"name": "ib", "hcas": ["mlx5_0"]}),
        fp(engine="vllm", modelPath="m", executable="/opt/vllm"),
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_the_label_and_descriptive_gpu_facts_do_not_change_it():
    base = fp(engine="vllm", modelPath="m")
    assert fp(engine="vllm", modelPath="m", name="qwen-on-h100") == base
    assert fp(engine="vllm", modelPath="m", gpus=[{"index": 0, "type": "H100"}]) == base


def test_unknown_never_reads_as_matching():
    assert drift_status(None, "sha256:abc") == UNKNOWN
    assert drift_status("sha256:abc", None) == UNKNOWN
    assert drift_status(None, None) == UNKNOWN
    assert drift_status("sha256:abc", "sha256:abc") == MATCH
    assert drift_status("sha256:abc", "sha256:def") == DRIFT


def test_the_control_plane_can_compute_the_reported_value_from_profile_json():
    raw = {"engine": "vllm", "modelPath": "m", "tensorParallel": 2, "gpus": [0, 1]}
    assert expected_fingerprint(raw, model_name="qwen-small", gpu_index=0) == fp(
        engine="vllm", modelPath="m", tensorParallel=2, gpus=[0, 1]
    )
    assert expected_fingerprint({"engine": "nope"}, model_name="x", gpu_index=0) is None
