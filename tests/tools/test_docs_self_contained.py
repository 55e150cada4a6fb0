"""A clone is self-contained: no file points at design notes that live outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Names of documents a clone does not have, and paths that leave the repository.
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bfacts\.md\b|\.\./shared\b|/work/shared\b")


def test_no_tracked_file_refers_to_documents_outside_the_repository():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.resolve() == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images
        offenders += [
            f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)
        ]
    assert offenders == []


def test_the_design_reference_has_the_sections_the_code_points_to():
    design = (ROOT / "docs" / "design.md").read_text()
    headings = set(re.findall(r"^#+ (.+)$", design, flags=re.M))
    cited = set()
    sources = [*ROOT.glob("fleets/**/*.py"), *ROOT.glob("haru/*.py"), *ROOT.glob("tests/**/*.py")]
    for path in [*sources, ROOT / "KNOWN_ISSUES.md"]:
        cited.update(re.findall(r'docs/design\.md, "([^"]+)"', path.read_text()))
    assert cited, "nothing cites docs/design.md"
    assert cited <= headings, sorted(cited - headings)
