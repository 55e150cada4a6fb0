"""Every install that runs a supervisor outside the main venv carries the supervisor's base install.

The torch tier's venv (Makefile's TORCH_PACKAGES, pinned by constraints-torch.txt) and the wheels
`make gpu-wheels` carries to a GPU host are listed by hand. A base dependency added to pyproject
and missed there breaks the supervisor's start only in the tier that skips here without the torch
wheel, or on the GPU host: the websockets import of the edge did once, in CI.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What `uvicorn[standard]` brings that the supervisor imports: the edge bounds uvicorn's websockets
# protocol (common/private_apis.py). The extra's other members (uvloop, watchfiles, dotenv,
# PyYAML) are optional at run time.
IMPORTED_EXTRAS = {"uvicorn": {"websockets"}}
# What a GPU host's image brings itself (bench/gpu_truth.sh checks these before it starts).
GPU_IMAGE_HAS = {"httpx", "nvidia-ml-py"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _supervisor_needs() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in project["dependencies"]}
    return names.union(*(IMPORTED_EXTRAS.get(n, set()) for n in names))


def _make_list(variable: str) -> set[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(rf"^{variable} := (.*)$", text, re.M)
    assert found, f"Makefile lacks {variable}"
    return {w.lower() for w in found.group(1).split()}


def _pins(path: Path) -> set[str]:
    return {
        line.split("==")[0].lower().replace("_", "-")
        for line in path.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }


def test_the_torch_venv_installs_and_pins_the_supervisors_base_install():
    needs = _supervisor_needs()
    assert needs - _make_list("TORCH_PACKAGES") == set()
    assert needs - _pins(ROOT / "constraints-torch.txt") == set()


def test_the_gpu_wheels_carry_what_the_gpu_image_lacks():
    script = (ROOT / "bench" / "gpu_wheels.sh").read_text()
    carried = set(re.search(r"\^\(([^)]*)\)==", script).group(1).lower().split("|"))
    assert _supervisor_needs() - GPU_IMAGE_HAS - carried == set()
    # The count the script checks its pins against is the list's length.
    assert f"-eq {len(carried)} ]" in script
