"""What an operator must read before deciding: said where the decision is made.

That no real GPU run is recorded is said at the top of each deployment page (not only at the end
of the README), and stays true: the day bench/results/ holds a GPU truth run, this fails until
the sentences are replaced. Every placeholder secret of the example environment files says how to
generate (or where to get) its value.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
NO_GPU_RUN = {
    "en": "No real GPU run has been recorded yet",
    "ja": "実 GPU での実行記録はまだありません",
}
GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def _before_first_section(path: str) -> str:
    text = (ROOT / path).read_text()
    return text[: text.index("\n## ")]


def _paragraph(path: str, start: str) -> str:
    text = (ROOT / path).read_text()
    return text[text.index(start) :].split("\n\n", 1)[0]


def test_no_gpu_run_is_recorded_as_the_docs_say():
    recorded = sorted(p.name for p in RESULTS.glob("gpu-truth-*"))
    assert recorded == [], (
        "bench/results holds a GPU truth run: replace the 'no real GPU run' sentences "
        "(README.md, README.ja.md, deploy/README*.md, docs/deployment.md)"
    )
    assert "None yet" in (RESULTS / "README.md").read_text()


# Where an operator decides: (language, the paragraph that must say it; None: the page's top).
WHERE = {
    "deploy/README.md": ("en", None),
    "deploy/README.ja.md": ("ja", None),
    "docs/deployment.md": ("en", None),
    "README.md": ("en", "**Deploying it.**"),
    "README.ja.md": ("ja", "**デプロイする。**"),
}


@pytest.mark.parametrize("path", WHERE)
def test_the_missing_gpu_run_is_said_where_an_operator_decides(path):
    language, paragraph = WHERE[path]
    text = _paragraph(path, paragraph) if paragraph else _before_first_section(path)
    assert NO_GPU_RUN[language] in text


def _placeholders(path: Path) -> list[tuple[str, str]]:
    """(variable, the comment lines just above it) for each value still holding change-me."""
    found, comments = [], []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            comments.append(line)
            continue
        match = re.match(r"([A-Z][A-Z0-9_]*)=(.*)", line)
        if match and "change-me" in match.group(2):
            found.append((match.group(1), "\n".join(comments)))
        comments = []
    return found


def test_every_placeholder_secret_says_how_to_generate_it():
    placeholders = _placeholders(ROOT / "deploy" / "haru.env.example")
    assert {"HARU_API_TOKEN", "HARU_SUPERVISOR_MASTER_KEY", "HARU_SECRET_KEY"} <= {
        name for name, _ in placeholders
    }
    for name, comment in placeholders:
        assert GENERATE in comment, f"haru.env.example: {name} does not say how to generate it"
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert GENERATE in readme
    for name, _ in placeholders:
        assert f"s|^{name}=" in readme, f"deploy/README.md does not replace {name}"


def test_the_supervisor_token_placeholder_says_where_the_token_comes_from():
    [(name, comment)] = _placeholders(ROOT / "deploy" / "supervisor.env.example")
    assert name == "HARU_SUPERVISOR_TOKEN"
    assert "supervisor_token <fleet>/<domain>" in comment
