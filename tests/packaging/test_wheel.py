"""The built wheel carries what the code reads at run time, and works from where it lands."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [built] = out.glob("haru-*.whl")
    return built


def _files(folder: Path) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_the_wheel_holds_templates_static_files_schemas_and_migrations(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        _files(ROOT / "haru" / "templates")
        | _files(ROOT / "haru" / "static")
        | _files(ROOT / "fleets" / "migrations")
        | {"fleets/layouts/schema.json", "supervisor/__main__.py", "haru/settings.py"}
        | {
            "supervisor/schemas/config.json",
            "supervisor/schemas/profile.json",
            "fleets/core/schemas/policy.json",
            "fleets/drivers/schemas/placement.json",
            "fleets/drivers/schemas/driver.json",
        }
    ):
        if "__pycache__" in needed:
            continue
        assert needed in names, f"{needed} is missing from {wheel.name}"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "Requires-Python: <3.14,>=3.11" in text


def test_an_unpacked_wheel_finds_its_templates_and_schema(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import django, haru, fleets.layouts.loader as loader\n"
        "django.setup()\n"
        "from django.template.loader import get_template\n"
        "origin = get_template('registration/login.html').origin.name\n"
        "print(haru.__file__)\n"
        "print(origin)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={
            "PYTHONPATH": str(site),
            "DJANGO_SETTINGS_MODULE": "haru.settings",
            "HARU_VAR_DIR": str(tmp_path / "var"),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    package, origin = result.stdout.split()
    assert package.startswith(str(site))
    assert origin.startswith(str(site / "haru" / "templates"))
