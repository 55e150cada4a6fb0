"""Every path the documents name is in the repository, and the README stays a front door.

A relative link (`[text](path)`, `[text](path#anchor)`) must reach a file or folder, and an
anchor into a Markdown file must name one of its headings. A backticked token that starts with
a top-level folder of the repository (`fleets/reconciler/tick.py`, `docs/`) must exist too
(globs such as `common/wire/schemas/*.json` must match something). Each test lists every broken
path at once, so a tree that moved many files shows the whole list in one run.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
DOCUMENTS = (
    "README.md",
    "README.ja.md",
    "CONTRIBUTING.md",
    "KNOWN_ISSUES.md",
    "docs/**/*.md",
    "bench/results/*.md",
    "deploy/**/*.md",
)
FENCE = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
# What ends a path inside a backticked span, and what may trail it in prose.
TOKEN_SPLIT = re.compile(r"[\s,;()\"'=]+")
TRAILING = ".,:;)"
# Placeholders name no file: `<fleet>`, `{ref}`, `…`, `...`.
PLACEHOLDER = re.compile(r"[<>{}…]|\.\.\.")


def documents() -> list[Path]:
    found: set[Path] = set()
    for pattern in DOCUMENTS:
        found.update(p for p in ROOT.glob(pattern) if p.is_file())
    return sorted(found)


@cache
def top_level_folders() -> frozenset[str]:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    return frozenset(name.split("/")[0] for name in tracked if "/" in name)


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a command there is an example, not a reference)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(_prose(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path, text: str) -> list[str]:
    wrong = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
            continue  # http(s), mailto: not a repository path
        name, _, anchor = target.partition("#")
        if name.startswith("/"):
            resolved = ROOT / name.lstrip("/")
        else:
            resolved = (path.parent / name) if name else path
        if not resolved.exists():
            wrong.append(f"link {target!r}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            wrong.append(f"link {target!r}: no heading with that anchor")
        elif not resolved.resolve().is_relative_to(ROOT):
            wrong.append(f"link {target!r}: outside the repository")
    return wrong


def path_tokens(text: str) -> list[str]:
    tokens = []
    for span in INLINE.findall(_prose(text)):
        for token in TOKEN_SPLIT.split(span):
            token = token.split("::")[0].rstrip(TRAILING)
            if "/" not in token or PLACEHOLDER.search(token):
                continue
            if token.split("/")[0] in top_level_folders():
                tokens.append(token)
    return tokens


def broken_paths(text: str) -> list[str]:
    wrong = []
    for token in path_tokens(text):
        exists = any(ROOT.glob(token)) if "*" in token else (ROOT / token).exists()
        if not exists:
            wrong.append(f"path `{token}`: not in the repository")
    return wrong


def _report(check) -> list[str]:
    out = []
    for path in documents():
        rel = path.relative_to(ROOT)
        out += [f"{rel}: {problem}" for problem in check(path, path.read_text(encoding="utf-8"))]
    return out


def test_every_relative_link_resolves():
    broken = _report(broken_links)
    assert broken == [], "\n".join(broken)


def test_every_backticked_repository_path_exists():
    broken = _report(lambda _path, text: broken_paths(text))
    assert broken == [], "\n".join(broken)


def test_the_readme_is_a_front_door_not_a_manual():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference to docs/"


def test_the_documents_checked_include_every_area():
    names = {str(p.relative_to(ROOT)) for p in documents()}
    assert {"README.md", "README.ja.md", "KNOWN_ISSUES.md", "docs/architecture.md"} <= names
    assert any(n.startswith("deploy/") for n in names)


def test_the_checks_catch_what_they_promise():
    here = ROOT / "README.md"
    assert broken_links(here, "[a](docs/architecture.md)") == []
    assert broken_links(here, "[a](docs/architecture.md#the-state-store)") == []
    assert len(broken_links(here, "[a](docs/no-such.md) [b](nowhere/#x)")) == 2
    assert len(broken_links(here, "[a](docs/architecture.md#no-such-heading)")) == 1
    assert broken_links(here, "[a](https://example.com/x) [b](#haru)") == []
    assert broken_links(here, "```\n[a](docs/no-such.md)\n```\n") == []
    assert broken_paths("`fleets/core/` and `common/wire/schemas/*.json`, `docs/design.md`.") == []
    assert broken_paths("see `fleets/no_such.py` or `docs/gone/`") == [
        "path `fleets/no_such.py`: not in the repository",
        "path `docs/gone/`: not in the repository",
    ]
    not_paths = "`/v1/fleets/{ref}` `manage.py serve` `var/haru.sqlite3` `fleets/<x>`"
    assert broken_paths(not_paths) == []
    assert slug("The `serve` command: 3 a.m.") == "the-serve-command-3-am"
    assert slug("日本語の見出し") == "日本語の見出し"
