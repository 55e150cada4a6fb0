"""Settings are declared once: the docs follow the declarations, and the code reads no
variable the declarations leave out (and no declaration lies unread)."""

from __future__ import annotations

import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

from common.setting import Kind, Setting, declared
from fleets.base.setting_table import TABLES
from haru import setting_docs
from supervisor.settings import ChildEnvironment, SupervisorSettings

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("fleets", "haru", "supervisor", "common")
ALL_TABLES = (*TABLES, SupervisorSettings, ChildEnvironment)
# A HARU_ name on its own: not the tail of another identifier (`_HARU_ONLY_NAMES`).
HARU_NAME = re.compile(r"(?<![A-Za-z0-9_])HARU_[A-Z0-9_]+")


def all_settings() -> list[Setting]:
    return [s for table in ALL_TABLES for s in declared(table)]


def declared_names() -> set[str]:
    return {s.env for s in all_settings()}


@cache
def shipped_sources() -> dict[Path, str]:
    return {
        path: path.read_text()
        for package in SHIPPED
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    }


@cache
def string_literals() -> list[str]:
    """Every string literal in the shipped code (f-string parts included)."""
    found = []
    for text in shipped_sources().values():
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)):
                found.append(token.string)
    return found


def test_the_committed_docs_match_the_declarations():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    generated = "\n".join(setting_docs.render()) + "\n"
    assert committed == generated, (
        f"docs/configuration.md is out of date with the declared settings: run\n"
        f"    {setting_docs.COMMAND}"
    )


def test_every_haru_name_in_the_code_is_declared():
    names = declared_names()
    unknown = set()
    for path, text in shipped_sources().items():
        for name in HARU_NAME.findall(text):
            # `HARU_HTTP_*` in prose names a family: some declared name must start with it.
            known = any(n.startswith(name) for n in names) if name.endswith("_") else name in names
            if not known:
                unknown.add(f"{name} ({path.relative_to(ROOT)})")
    # Declare each in fleets/base/setting_table.py, or supervisor/settings.py for the agent.
    assert unknown == set()


def test_every_declared_setting_is_read_somewhere():
    """Read: its name in a string outside its own declaration, or its key used in code."""
    literals = string_literals()
    code = "\n".join(shipped_sources().values())
    unread = []
    for setting in all_settings():
        quoted = sum(setting.env in literal for literal in literals)
        by_key = re.search(rf"\.{setting.key}\b|[\"']{setting.key}[\"']", code)
        if quoted < 2 and by_key is None:
            unread.append(setting.env)
    assert unread == []


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.__name__)
def test_a_table_declares_each_name_once(table):
    names = [s.env for s in declared(table)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("setting", all_settings(), ids=lambda s: f"{s.key}:{s.env}")
def test_a_declaration_is_complete_and_its_default_within_its_bounds(setting):
    assert setting.doc and setting.area and setting.key
    if setting.kind is Kind.INTEGER:
        assert setting.minimum is not None and setting.maximum is not None
        if setting.default is not None:
            assert setting.minimum <= setting.default <= setting.maximum
    if setting.kind in (Kind.URL, Kind.CHOICE):
        assert setting.choices
