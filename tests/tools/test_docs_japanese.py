"""Each operator document has a Japanese twin with the same sections and the same commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [("README.md", "README.ja.md"), ("deploy/README.md", "deploy/README.ja.md")]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# A comment after a command (two spaces or more, then #) or a whole-line comment: prose, which
# is translated. Everything else in a code block is a command and must be the same.
COMMENT = re.compile(r"(^\s*#.*$)|(\s{2,}#.*$)")
INLINE = re.compile(r"`([^`]+)`")  # may wrap onto the next line
COMMAND_START = (".venv/bin/", "make ", "python ", "curl ", "systemctl ", "django-admin ", "sudo ")


def _outside_code(text: str) -> str:
    return FENCE.sub("", text)


def headings(text: str) -> list[int]:
    """Heading levels in order (code blocks left out: a `# comment` there is no heading)."""
    return [len(m.group(1)) for m in re.finditer(r"^(#+) ", _outside_code(text), flags=re.M)]


def commands(text: str) -> list[str]:
    out = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            command = COMMENT.sub("", line).rstrip()
            if command:
                out.append(command)
    return out


def inline_commands(text: str) -> set[str]:
    spans = (" ".join(c.split()) for c in INLINE.findall(_outside_code(text)))
    return {c for c in spans if c.startswith(COMMAND_START)}


@pytest.mark.parametrize(("english", "japanese"), PAIRS)
def test_both_languages_have_the_same_sections(english, japanese):
    en, ja = (ROOT / english).read_text(), (ROOT / japanese).read_text()
    assert headings(en) == headings(ja)


@pytest.mark.parametrize(("english", "japanese"), PAIRS)
def test_both_languages_show_the_same_commands(english, japanese):
    en, ja = (ROOT / english).read_text(), (ROOT / japanese).read_text()
    assert commands(en) == commands(ja)
    assert inline_commands(en) == inline_commands(ja)


@pytest.mark.parametrize(("english", "japanese"), PAIRS)
def test_each_links_to_the_other_and_the_japanese_one_is_japanese(english, japanese):
    en, ja = (ROOT / english).read_text(), (ROOT / japanese).read_text()
    assert f"[日本語]({Path(japanese).name})" in en
    assert f"[English]({Path(english).name})" in ja
    kana = len(re.findall(r"[\u3040-\u30ff]", _outside_code(ja)))
    assert kana > len(_outside_code(ja)) // 10  # prose, not an English copy


def test_the_comparison_catches_a_drifted_command():
    assert commands("```sh\nmake demo  # a\n```\n") == commands("```sh\nmake demo  # あ\n```\n")
    assert commands("```sh\nmake demo\n```\n") != commands("```sh\nmake test\n```\n")
    assert headings("# a\n```sh\n# not a heading\n```\n## b\n") == [1, 2]
