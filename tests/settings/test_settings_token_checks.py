"""A short bearer token is accepted (it still works) but warned about at every start."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.checks import run_checks


@pytest.fixture
def tokens(monkeypatch):
    def set_tokens(api: str | None, supervisor: str | None) -> None:
        monkeypatch.setitem(settings.HARU, "api_token", api)
        monkeypatch.setitem(settings.HARU, "supervisor_token", supervisor)

    return set_tokens


def test_a_one_character_token_is_warned_about_without_printing_it(tokens):
    tokens("x", "short-supervisor")
    found = [m for m in run_checks() if m.id == "haru.W001"]
    assert [m.msg for m in found] == [
        "HARU_API_TOKEN is 1 characters; use at least 32",
        "HARU_SUPERVISOR_TOKEN is 16 characters; use at least 32",
    ]
    assert all("short-supervisor" not in (m.msg + (m.hint or "")) for m in found)


def test_long_or_unset_tokens_raise_no_warning(tokens):
    tokens("a" * 32, None)
    assert [m for m in run_checks() if m.id == "haru.W001"] == []
