"""tools/ensure-venv: which venv a `make` keeps, rebuilds or refreshes, against fake interpreters.

`--plan` prints the decision and changes nothing, so these run in a second without pip or a
network. Issue 28: `make PYTHON=... demo`, then a plain `make`, rebuilt `.venv` with the first
Python found, a minute each switch; a plain `make` now keeps the venv whatever built it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tools.test_pick_python import isolated_env

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "tools" / "ensure-venv"
BASH = shutil.which("bash") or "/bin/bash"
TOOLS = ("cat", "sha256sum", "cut", "realpath", "dirname", "rm", "ls", "sort")
DIGEST = hashlib.sha256(
    (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes()
).hexdigest()[:16]


def interpreter(path: Path, version: str, base: Path | None = None) -> Path:
    """A fake Python answering the three questions the scripts ask: the pick-python probe, the
    version, and (as a venv's python) the version with its base interpreter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    minor = version.rsplit(".", 1)[0]
    path.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        f'  *ensurepip*) echo "{minor} {path}" ;;\n'
        f'  *_base_executable*) echo "{version} {base or path}" ;;\n'
        f'  *sys.version*) echo "{version}" ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def box(tmp_path):
    """Two installed Pythons, 3.12 (which built the venv) and 3.13 (the only one on PATH, so
    what pick-python finds first), and a PATH of fakes plus the utilities the scripts use."""
    utils = tmp_path / "utils"
    utils.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed"
        (utils / tool).symlink_to(found)
    built_with = interpreter(tmp_path / "opt" / "python3.12", "3.12.1")
    interpreter(tmp_path / "bin" / "python3.13", "3.13.0")
    return tmp_path, built_with


def venv_of(tmp_path: Path, base: Path, version: str = "3.12.1", deps: str = DIGEST) -> Path:
    """A venv as ensure-venv leaves it: its python, and the stamp naming the interpreter."""
    venv = tmp_path / "venv"
    interpreter(venv / "bin" / "python", version, base=base)
    (venv / ".installed").write_text(f"python={base} version={version} deps={deps}\n")
    return venv


def plan(tmp_path: Path, venv: Path, *args: str, python: str | None = None) -> str:
    env = isolated_env(tmp_path, python)
    result = subprocess.run(
        [BASH, str(ENSURE), "--plan", str(venv), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_plain_make_keeps_the_venv_whatever_python_built_it(box):
    tmp_path, built_with = box
    venv = venv_of(tmp_path, built_with)
    stamp = (venv / ".installed").read_text()
    assert plan(tmp_path, venv) == "keep"  # not 3.13, though pick-python would find it first
    assert plan(tmp_path, venv, python="") == "keep"  # the Makefile's `export PYTHON`, unset
    assert (venv / ".installed").read_text() == stamp  # --plan changes nothing


def test_naming_the_same_python_keeps_it_and_another_rebuilds_saying_why(box):
    tmp_path, built_with = box
    venv = venv_of(tmp_path, built_with)
    assert plan(tmp_path, venv, python=str(built_with)) == "keep"
    other = tmp_path / "bin" / "python3.13"
    assert plan(tmp_path, venv, python=str(other)) == (
        f"rebuild: {venv} was built with Python 3.12.1 ({built_with}); PYTHON asks for 3.13.0 "
        f"({other})"
    )


def test_changed_dependencies_reinstall_into_the_same_venv(box):
    tmp_path, built_with = box
    venv = venv_of(tmp_path, built_with, deps="0123456789abcdef")
    assert plan(tmp_path, venv) == "install: pyproject.toml or constraints.txt changed"
    (venv / ".installed").unlink()
    assert plan(tmp_path, venv).startswith(f"install: {venv} is not stamped")


def test_a_missing_venv_is_built_with_the_first_python_found(box):
    tmp_path, _ = box
    assert plan(tmp_path, tmp_path / "venv") == f"build: no venv at {tmp_path / 'venv'} yet"


def test_a_venv_whose_python_went_away_is_rebuilt(box):
    tmp_path, built_with = box
    venv = venv_of(tmp_path, built_with)
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "opt" / "gone")
    assert plan(tmp_path, venv) == f"rebuild: {venv}'s interpreter does not run any more"


def test_a_minor_argument_rebuilds_a_venv_of_another_minor_only(box):
    tmp_path, built_with = box
    venv = venv_of(tmp_path, built_with)
    assert plan(tmp_path, venv, "3.12") == "keep"
    assert plan(tmp_path, venv, "3.13") == (
        f"rebuild: {venv} has Python 3.12.1 ({built_with}); Python 3.13 is asked for"
    )


def test_a_venv_of_an_unsupported_python_is_rebuilt(box):
    tmp_path, _ = box
    old = interpreter(tmp_path / "opt" / "python3.10", "3.10.13")
    venv = venv_of(tmp_path, old, version="3.10.13")
    assert plan(tmp_path, venv).startswith(f"rebuild: {venv}'s Python 3.10.13 ({old}) is no")


def test_a_failed_venv_build_leaves_no_venv_behind(tmp_path):
    """An interpreter that runs but cannot install: the half-built venv is removed, not reused."""
    python = tmp_path / "python3.13"
    python.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        f'  *ensurepip*) echo "3.13 {python}" ;;\n'
        '  *sys.version*) echo "3.13.0" ;;\n'
        '  venv) mkdir -p "$3/bin"; ln -s /bin/false "$3/bin/python"; exit 0 ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    python.chmod(0o755)
    venv = tmp_path / "venv"
    result = subprocess.run(
        [str(ENSURE), str(venv)],
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "removed" in result.stderr
    assert not venv.exists()
    # Each step said what it was doing before the failure: a first build never looks hung.
    assert "[1/3] creating" in result.stdout and "[2/3] upgrading pip" in result.stdout
