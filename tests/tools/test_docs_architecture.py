"""docs/architecture.md's layer table is the one tests/tools/test_import_layers.py enforces."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tools.test_import_layers import LAYERS

ROOT = Path(__file__).resolve().parents[2]


def documented_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(layer, module prefixes) of each row of the table under "Layers", in order."""
    section = text.split("## Layers: what may import what", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in {"layer", ""} or set(cells[0]) <= {"-"}:
            continue
        folders = re.findall(r"`([^`]+)`", cells[1])
        prefixes = tuple(f.rstrip("/").removesuffix(".py").replace("/", ".") for f in folders)
        rows.append((cells[0], prefixes))
    return rows


def test_the_documented_layers_are_the_enforced_ones():
    """The same layers in the same order (bottom first), each with the same folders."""
    documented = documented_layers((ROOT / "docs" / "architecture.md").read_text())
    assert [(name, set(prefixes)) for name, prefixes in documented] == [
        (name, set(prefixes)) for name, prefixes in LAYERS
    ]


def test_every_documented_folder_exists():
    documented = documented_layers((ROOT / "docs" / "architecture.md").read_text())
    missing = [
        prefix
        for _, prefixes in documented
        for prefix in prefixes
        if not (ROOT / prefix.replace(".", "/")).is_dir()
        and not (ROOT / f"{prefix.replace('.', '/')}.py").is_file()
    ]
    assert missing == []


def test_the_reader_sees_a_row_out_of_order():
    table = (
        "## Layers: what may import what\n\n| layer | folder | holds |\n|---|---|---|\n"
        "| writes | `fleets/services/` | x |\n| reads | `fleets/reads/`, `fleets/x.py` | y |\n"
    )
    assert documented_layers(table) == [
        ("writes", ("fleets.services",)),
        ("reads", ("fleets.reads", "fleets.x")),
    ]
