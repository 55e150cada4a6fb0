"""The torch tier: the torch backends as real processes, run with the torch venv's python.

The main venv never gets torch. `make test-torch` builds `var/venvs/torch` (`make torch-env`)
from the machine's local CPU torch wheel, then runs this tier; `make test` leaves it out. These
tests skip only where that wheel is missing, and fail (with the command to run) where it is
there but the venv was not built.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
TORCH_VENV = REPO_ROOT / "var" / "venvs" / "torch"
WHEEL_DIR = os.environ.get("TORCH_WHEEL_DIR", "/opt/wheels")
WHEEL_GLOB = "torch-2.13.0+cpu-cp311-*.whl"
# A torch process imports torch, transformers and peft first: seconds on a busy machine.
START_TIMEOUT_S = 180.0


@pytest.fixture(scope="session")
def torch_python() -> str:
    """The torch venv's interpreter; skip without the local wheel, fail without the venv."""
    python = TORCH_VENV / "bin" / "python"
    # The stamp `make torch-env` leaves, keyed by the constraints it installed.
    key = hashlib.sha256((REPO_ROOT / "constraints-torch.txt").read_bytes()).hexdigest()[:16]
    if (TORCH_VENV / f".installed-{key}").exists() and python.exists():
        return str(python)
    if not glob.glob(os.path.join(WHEEL_DIR, WHEEL_GLOB)):
        pytest.skip(
            f"no local CPU torch wheel ({WHEEL_GLOB}) in {WHEEL_DIR}: the torch tier needs it"
        )
    pytest.fail(
        f"the torch venv {TORCH_VENV} is missing or older than constraints-torch.txt; run "
        "`make test-torch` (the local torch wheel is here, so this tier must run, not skip)"
    )


@pytest.fixture
def run_torch(torch_python, tools):
    """Run a module under the torch venv to completion; return the CompletedProcess."""

    def run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 240):
        return subprocess.run(
            [torch_python, *args],
            env=tools.child_env(env),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
