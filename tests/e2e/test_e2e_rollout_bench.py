"""bench/rollout.py, a tiny run: the slow candidate and the empty arm at a low rate; the last
line holds every figure issue 25 names, and the targets of the runs made hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ISSUE_FIELDS = (
    "slow_detection_s",
    "slow_rollback_s",
    "wrong_answer_user_requests",
    "succeeded",
    "rate_rps",
    "slowdown",
    "split_503s",
    "requests",
    "failed_requests",
)


def test_a_tiny_run_detects_the_slow_candidate_and_the_empty_arm_costs_no_503():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARU_")}
    argv = [
        sys.executable, "bench/rollout.py", "--runs", "slow,empty_arm", "--rate", "10",
        "--min-samples", "10", "--empty-s", "3", "--json",
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(ISSUE_FIELDS) <= set(result)
    assert (result["rate_rps"], result["slowdown"]) == (10.0, 2.0)
    assert result["runs"]["slow"]["state"] == "rolled_back"
    assert result["slow_detection_s"] <= 30 and result["slow_rollback_s"] <= 1
    assert result["split_503s"] == 0
    assert result["requests"] > 50 and result["failed_requests"] == 0
    # Runs not made say so rather than pass.
    assert result["wrong_answer_user_requests"] is None and result["succeeded"] is None
