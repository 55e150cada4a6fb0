"""The simulator's backend switch, without torch: parsing, device numbering, the torch-free path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from supervisor.sim.__main__ import parse_args
from supervisor.sim.backends import cuda_ordinal
from supervisor.sim.trainer import wants_torch


def test_the_default_backend_is_the_plain_simulator_with_no_backend_settings():
    options, _ = parse_args(["--port", "1", "--model", "m"])
    assert options.backend == "sim" and options.backend_settings == {}


def test_torch_backend_settings_are_parsed_and_validated():
    options, _ = parse_args(
        ["--port", "1", "--model", "m", "--backend", "torch", "--kv-cache-mib", "64"]
    )
    assert options.backend_settings["kv_cache_mib"] == 64
    assert options.backend_settings["device"] == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--port", "1", "--model", "m", "--backend", "torch", "--device", "tpu"])


def test_torch_only_flags_are_refused_on_the_plain_simulator():
    with pytest.raises(SystemExit):
        parse_args(["--port", "1", "--model", "m", "--kv-cache-mib", "64"])


def test_a_pinned_gpu_is_device_zero_inside_the_process():
    assert cuda_ordinal(3, {"CUDA_VISIBLE_DEVICES": "3"}) == 0
    assert cuda_ordinal(3, {}) == 3
    assert cuda_ordinal(3, {"CUDA_VISIBLE_DEVICES": " "}) == 3


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--backend", "torch", "--max-steps", "2"], True),
        (["--backend=torch"], True),
        (["--backend", "sim"], False),
        (["--memory-mib", "10"], False),
        (["--backend"], False),
    ],
)
def test_the_trainer_hands_over_to_torch_only_when_asked(argv, expected):
    assert wants_torch(argv) is expected


def test_the_default_simulator_and_trainer_never_import_torch(tools):
    code = (
        "import sys, supervisor.sim.__main__, supervisor.sim.engine, supervisor.sim.trainer\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft', 'safetensors') "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], env=tools.child_env(), check=True, timeout=60)
