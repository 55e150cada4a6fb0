"""`bench/gpu_truth.py --device cpu`: every step of the GPU truth script, minus NVML's figures.

The script is run on a GPU only when one is lent, which may be months apart; this keeps it from
rotting in between. It drives the real torch engine, trainer and supervisor, so a broken step
fails here, not at the start of a scarce GPU session.
"""

from __future__ import annotations

import json
import subprocess

import pytest

# The torch tier: left out of `make test`, run by `make test-torch` (and .ci/run).
pytestmark = [pytest.mark.torch, pytest.mark.integration]


def test_gpu_truth_dry_run_runs_every_step_and_writes_its_figures(tmp_path, torch_python, tools):
    # Through the one command a GPU host runs, so its set-up and checks are exercised too.
    done = subprocess.run(
        ["bash", "bench/gpu_truth.sh", "--device", "cpu", "--out", str(tmp_path)],
        env=tools.child_env({"PYTHON": torch_python}),
        cwd=tools.repo_root,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [written] = tmp_path.glob("gpu-truth-*-cpu-dry-run.json")
    results = json.loads(written.read_text())
    assert written.with_suffix(".txt").read_text().strip() in done.stdout

    assert results["device"] == "cpu" and results["gpu"]["source"] == "sim-state"
    assert results["bandwidth"]["pinnedH2DBytesPerS"] > 0
    engines = results["engines"]
    assert [(e["level"], e["weightsMiB"]) for e in engines] == [(1, 16), (1, 48), (2, 16)]
    for e in engines:
        assert e["bitExact"] is True
        assert e["wakeBytesPerS"] > 0
        assert [s["stage"] for s in e["stages"]] == [
            "engine load",
            f"level-{e['level']} sleep",
            "wake",
        ]
        # The simulated GPU saw the weights leave on sleep and come back on wake.
        assert e["stages"][1]["nvmlDeltaBytes"] == -e["weightsMiB"] * 2**20
        assert e["stages"][2]["nvmlDeltaBytes"] == e["weightsMiB"] * 2**20

    sigterm, sigkill = results["trainer"]
    assert (sigterm["path"], sigterm["killed"], sigterm["exitCode"]) == ("sigterm", False, 0)
    assert (sigkill["path"], sigkill["killed"]) == ("sigkill", True)
    assert sigkill["exitS"] >= sigkill["graceMs"] / 1000  # it ignored SIGTERM until the kill
    for t in (sigterm, sigkill):
        assert t["heldBytes"] > 0 and t["releasedS"] is not None

    promotion = results["promotion"]
    assert list(promotion["stepsS"]) == ["stop_training", "verify_gpu", "wake", "probe"]
    assert promotion["probeOk"] is True and promotion["ready"] is True
    # A CPU run judges nothing: its figures say nothing about a GPU.
    assert results["targets"] and all(t["pass"] is None for t in results["targets"])
