"""The torch trainer under the trainer contract: a real LoRA loop, checkpoints, SIGTERM, limits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

# The torch tier: left out of `make test`, run by `make test-torch` (and .ci/run).
pytestmark = [pytest.mark.torch, pytest.mark.integration]

START_TIMEOUT_S = 180.0
TRAINER = ["-m", "supervisor.sim.trainer", "--backend", "torch", "--device", "cpu"]


def checkpoint_state(directory, step: int) -> dict:
    return json.loads((directory / f"step-{step:06d}" / "state.json").read_text())


def test_trainer_saves_on_sigterm_and_resumes_from_that_step(
    tmp_path, processes, tools, torch_python, run_torch
):
    ckpt, report = tmp_path / "ckpt", tmp_path / "report.json"
    env = tools.child_env({"HARU_CHECKPOINT_DIR": str(ckpt), "HARU_GPU_INDEX": "0"})
    proc = processes.start(
        [
            torch_python,
            *TRAINER,
            "--checkpoint-every-s",
            "0.5",
            "--min-step-s",
            "0.02",
            "--report",
            str(report),
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    # Wait for the first periodic checkpoint: training is under way.
    tools.wait_for(lambda: json.loads(report.read_text())["step"] > 0, timeout=START_TIMEOUT_S)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    stderr = proc.stderr.read().decode()
    saved = [line for line in stderr.splitlines() if "SIGTERM: saved step" in line]
    assert saved, stderr
    step = int(saved[0].split("saved step ")[1].split()[0])
    state = checkpoint_state(ckpt, step)
    assert state["reason"] == "sigterm" and state["step"] == step

    # A newer checkpoint whose adapter does not match its digest (a bad disk, a torn copy) is
    # skipped for the good one before it.
    bad = ckpt / f"step-{step + 100:06d}"
    shutil.copytree(ckpt / f"step-{step:06d}", bad)
    (bad / "state.json").write_text(json.dumps({**state, "adapterDigest": "0" * 16}))

    resumed = run_torch([*TRAINER, "--max-steps", str(step + 3)], env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipping checkpoint {bad.name}" in resumed.stderr
    assert f"resumed from step {step} " in resumed.stderr
    # The adapter it loaded is the one that was saved (its digest is checked on load too).
    assert f"adapter digest {state['adapterDigest']}" in resumed.stderr
    assert checkpoint_state(ckpt, step + 3)["reason"] == "finished"


def test_trainer_refuses_to_start_beyond_its_memory_limit(tmp_path, run_torch):
    env = {"HARU_CHECKPOINT_DIR": str(tmp_path), "HARU_GPU_MEMORY_LIMIT_MIB": "4"}
    refused = run_torch([*TRAINER, "--max-steps", "1", "--memory-mib", "8"], env=env)
    assert refused.returncode == 3, refused.stderr
    assert "over HARU_GPU_MEMORY_LIMIT_MIB=4" in refused.stderr
    assert not any(tmp_path.iterdir())  # nothing trained, nothing saved

    env["HARU_GPU_MEMORY_LIMIT_MIB"] = "64"
    fits = run_torch([*TRAINER, "--max-steps", "1", "--memory-mib", "8"], env=env)
    assert fits.returncode == 0, fits.stderr


def test_trainer_rejects_a_malformed_memory_limit(tmp_path, run_torch):
    env = {"HARU_CHECKPOINT_DIR": str(tmp_path), "HARU_GPU_MEMORY_LIMIT_MIB": "lots"}
    result = run_torch([*TRAINER, "--max-steps", "1"], env=env)
    assert result.returncode == 2
    assert "HARU_GPU_MEMORY_LIMIT_MIB must be a whole number" in result.stderr
