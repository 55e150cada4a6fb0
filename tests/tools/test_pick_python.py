"""tools/pick-python, run against fake interpreters: it must run each candidate, not trust it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PICK = ROOT / "tools" / "pick-python"


def fake_python(path: Path, version: str | None) -> Path:
    """An executable that answers the probe like a real interpreter of `version`, or fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if version is None:
        body = 'echo "pyenv: python3.x: command not found" >&2\nexit 127\n'
    else:
        body = f'echo "{version} {path}"\n'
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def isolated_env(tmp_path: Path, python: str | None = None) -> dict[str, str]:
    """An environment that sees only `tmp_path`'s fakes and utilities (and PYTHON if given)."""
    env = {
        "PATH": f"{tmp_path / 'bin'}:{tmp_path / 'utils'}",
        "HOME": str(tmp_path / "home"),
        "PYENV_ROOT": str(tmp_path / "pyenv"),
    }
    if python is not None:
        env["PYTHON"] = python
    return env


def pick(tmp_path: Path, *args: str, python: str | None = None) -> subprocess.CompletedProcess:
    env = isolated_env(tmp_path, python)
    return subprocess.run(
        [str(PICK), *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def bare(tmp_path):
    """A PATH that holds only the fakes and the two utilities the script uses, no real Python."""
    (tmp_path / "bin").mkdir()
    utils = tmp_path / "utils"
    utils.mkdir()
    for tool in ("ls", "sort"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed"
        (utils / tool).symlink_to(found)
    return tmp_path


def test_a_failing_shim_on_path_is_skipped_for_a_working_pyenv_install(bare):
    fake_python(bare / "bin" / "python3.11", version=None)
    real = fake_python(
        bare / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12", version="3.12"
    )
    result = pick(bare)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(real)


def test_path_is_preferred_to_pyenv_and_lower_minors_first(bare):
    on_path = fake_python(bare / "bin" / "python3.12", version="3.12")
    fake_python(bare / "pyenv" / "versions" / "3.11.7" / "bin" / "python3.11", version="3.11")
    fake_python(bare / "bin" / "python3.13", version="3.13")
    # 3.11 is tried first on PATH (absent), then 3.12 on PATH wins before any pyenv install.
    assert pick(bare).stdout.strip() == str(on_path)


def test_the_newest_pyenv_patch_release_is_tried_first(bare):
    fake_python(bare / "pyenv" / "versions" / "3.13.2" / "bin" / "python3.13", version="3.13")
    newest = fake_python(bare / "pyenv" / "versions" / "3.13.10" / "bin" / "python3.13", "3.13")
    assert pick(bare).stdout.strip() == str(newest)


def test_a_candidate_reporting_an_unsupported_version_is_refused(bare):
    fake_python(bare / "bin" / "python3.11", version="3.10")
    result = pick(bare)
    assert result.returncode == 1
    assert "Python 3.10, not one of" in result.stderr
    assert "make PYTHON=" in result.stderr


def test_nothing_usable_fails_with_a_hint(bare):
    result = pick(bare)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "no usable Python 3.11 3.12 3.13" in result.stderr


def test_python_override_is_the_only_candidate(bare):
    fake_python(bare / "bin" / "python3.11", version="3.11")
    chosen = fake_python(bare / "elsewhere" / "py", version="3.13")
    assert pick(bare, python=str(chosen)).stdout.strip() == str(chosen)


def test_a_broken_python_override_is_an_error_not_a_fallback(bare):
    fake_python(bare / "bin" / "python3.11", version="3.11")
    shim = fake_python(bare / "bin" / "python3.12", version=None)
    result = pick(bare, python=str(shim))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"PYTHON={shim} cannot build" in result.stderr


def test_a_minor_argument_restricts_the_search(bare):
    fake_python(bare / "bin" / "python3.11", version="3.11")
    only = fake_python(bare / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12", "3.12")
    assert pick(bare, "3.12").stdout.strip() == str(only)
    refused = pick(bare, "3.9")
    assert refused.returncode == 2
    assert "not a supported Python" in refused.stderr


def test_supported_versions_match_requires_python():
    pyproject = (ROOT / "pyproject.toml").read_text()
    low, high = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', pyproject).groups()
    expected = " ".join(f"3.{m}" for m in range(int(low), int(high)))
    assert f'SUPPORTED="{expected}"' in PICK.read_text()


def test_the_real_interpreter_running_the_suite_is_accepted():
    """The probe works against a real Python (imports venv and ensurepip, prints its path)."""

    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        [str(PICK)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).exists()
