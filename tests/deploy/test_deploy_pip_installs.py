"""No example or doc tells pip to install `haru` from the package index.

The index's `haru` is an unrelated project: `pip install haru` (or `'haru[supervisor]'`) would
put someone else's code on a GPU host. Haru is installed from a checkout (`-e .`), a wheel path,
or a direct reference pinned by hash: `haru @ <url>#sha256=<hash>` or a git URL at a commit.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where an operator or a contributor copies commands from.
SOURCES = ["docs", "examples", "deploy", "bench", "tools", ".ci"]
TOP_FILES = ["README.md", "README.ja.md", "CONTRIBUTING.md", "KNOWN_ISSUES.md", "Makefile"]
TEXT = {".md", ".yaml", ".yml", ".json", ".sh", ".txt", ".toml", ".example", ""}
PIP_INSTALL = re.compile(r"\bpip3?\s+install\b(.*)")
# Where a shell command (or the inline code holding it) ends.
COMMAND_END = re.compile(r"&&|\|\||[;|`)]|\s#(?!\S*sha256)")
# pip options that take a value (the value is not a requirement).
VALUED = {
    "-c", "--constraint", "-r", "--requirement", "-e", "--editable", "-t", "--target",
    "-d", "--dest", "-w", "--wheel-dir", "-f", "--find-links", "-i", "--index-url",
    "--extra-index-url", "--python-version", "--platform", "--implementation", "--only-binary",
    "--no-binary", "--prefix", "--root", "--progress-bar", "--upgrade-strategy",
}  # fmt: skip
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?\s*(.*)$", re.S)
# A hash written out, a placeholder for it (<wheel-sha256>) or the shell variable holding it.
PINNED = re.compile(
    r"#sha256=(?:[0-9a-f]{64}\b|<[^>]+>|\$\{?[A-Z_][A-Z0-9_]*\}?)|^git\+\S+@[0-9a-f]{40}\b"
)


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def _files() -> list[Path]:
    found = [ROOT / name for name in TOP_FILES]
    for top in SOURCES:
        found += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in TEXT]
    return [p for p in found if p.exists() and "results" not in p.parts]


def _requirements(text: str) -> list[str]:
    """Every requirement argument of every `pip install` in `text`."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        for match in PIP_INSTALL.finditer(line):
            command = COMMAND_END.split(match.group(1), maxsplit=1)[0]
            try:
                words = shlex.split(command)
            except ValueError:
                words = command.split()
            skip = False
            for word in words:
                if skip:
                    skip = False
                elif word.startswith("-"):
                    skip = word in VALUED
                else:
                    found.append(word)
    return found


def problem(requirement: str, extras: set[str]) -> str | None:
    """Why a requirement is a wrong way to install Haru, or None."""
    parsed = REQUIREMENT.match(requirement)
    if parsed is None or parsed.group(1).lower() != "haru":
        return None  # another package, a path (./dist/...), a URL
    named_extras = {e.strip() for e in (parsed.group(2) or "").split(",") if e.strip()}
    if named_extras - extras:
        return f"{requirement!r}: Haru has no extra {sorted(named_extras - extras)}"
    rest = parsed.group(3).strip()
    if not rest.startswith("@"):
        return f"{requirement!r} installs the package index's unrelated `haru`"
    if not PINNED.search(rest.lstrip("@ ")):
        return f"{requirement!r}: pin it by hash (#sha256=...) or a git commit"
    return None


@pytest.mark.parametrize(
    "requirement",
    [
        "haru",
        "haru[supervisor]",
        "haru==0.1.0",
        "HARU[server]>=0.1",
        "haru @ https://x/h.whl",
        "haru @ https://x/h.whl#sha256=abc",
    ],
)
def test_the_check_refuses_haru_from_the_index_or_unpinned(requirement):
    assert problem(requirement, {"server", "dev"}) is not None


@pytest.mark.parametrize(
    "requirement",
    [
        "haru @ https://x/haru-0.1.0-py3-none-any.whl#sha256=" + "ab" * 32,
        "haru[server] @ file:///opt/haru/dist/haru-0.1.0-py3-none-any.whl#sha256=<wheel-sha256>",
        "haru @ git+https://git.example.internal/haru.git@" + "0" * 40,
        "haru @ file:///opt/haru/src/haru-0.1.0-py3-none-any.whl#sha256=$WHEEL_SHA256",
        "./dist/haru-0.1.0-py3-none-any.whl",
        ".",
        "vllm==0.32.0",
    ],
)
def test_the_check_accepts_haru_from_its_own_wheel_or_source(requirement):
    assert problem(requirement, {"server", "dev"}) is None


def test_the_scanner_finds_requirements_in_yaml_and_shell():
    text = (
        "setup: |\n  pip install 'haru[supervisor]' vllm\n"
        "run: x && pip install -q \\\n  -c c.txt haru  # comment\n"
    )
    assert _requirements(text) == ["haru[supervisor]", "vllm", "haru"]


def test_no_example_or_doc_installs_haru_from_the_package_index():
    extras = _extras()
    wrong = [
        f"{path.relative_to(ROOT)}: {why}"
        for path in _files()
        for requirement in _requirements(path.read_text(errors="replace"))
        if (why := problem(requirement, extras))
    ]
    assert wrong == []
