"""The schema files ship in the wheel: an installed package validates without the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

CHECK = """
import sys
sys.path = [p for p in sys.path if p not in ("", {repo!r})]
sys.path.insert(0, {target!r})
import common.wire.contract as contract
assert contract.__file__.startswith({target!r}), contract.__file__
assert contract.problems("probe.response", {{"ok": True, "results": []}}) == []
assert contract.problems("probe.response", {{"ok": True, "results": [{{"error": None}}]}})
print(len(contract.schema_names()))
"""


def test_an_installed_wheel_carries_and_validates_with_the_schemas(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("haru-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n for n in names if n.startswith("common/wire/schemas/")}
    in_repo = {f"common/wire/schemas/{p.name}" for p in REPO.glob("common/wire/schemas/*")}
    assert shipped == in_repo
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(repo=str(REPO), target=str(target))],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert int(out.stdout) == len(in_repo)
