"""The token check remembers the headers it accepted (the chat path checks one per request),
and only those, only for the settings they were checked against, and only so many."""

from __future__ import annotations

import pytest

from fleets.base import tokens
from fleets.base.tokens import Scope, token_scope

OPERATOR = "operator-token-0123456789abcdefghijklmnopq"
CHAT = "chat-token-0123456789abcdefghijklmnopqrstu"


@pytest.fixture
def configured(settings):
    settings.HARU = {**settings.HARU, "api_token": OPERATOR, "chat_tokens": [CHAT]}


@pytest.fixture
def comparisons(monkeypatch):
    """Count the constant-time comparisons the check makes."""
    calls = []
    real = tokens.hmac.compare_digest

    def counting(a, b):
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", counting)
    return calls


def test_an_accepted_header_is_compared_in_full_once(configured, comparisons):
    assert token_scope(f"Bearer {CHAT}") is Scope.CHAT
    first = len(comparisons)
    assert first > 0
    for _ in range(3):
        assert token_scope(f"Bearer {CHAT}") is Scope.CHAT
        assert token_scope(f"Bearer {OPERATOR}") is Scope.OPERATOR
    assert len(comparisons) == first + 1  # the operator header's own first check, then none


def test_a_refused_header_is_compared_every_time_and_never_kept(configured, comparisons):
    for attempt in range(1, 4):
        assert token_scope("Bearer not-a-token") is None
        assert len(comparisons) == 2 * attempt  # the operator token and the one chat token
    assert "Bearer not-a-token" not in tokens._accepted.checked[1]


def test_a_settings_change_forgets_what_was_accepted(configured, settings):
    assert token_scope(f"Bearer {CHAT}") is Scope.CHAT
    settings.HARU = {**settings.HARU, "chat_tokens": []}  # the chat token revoked
    assert token_scope(f"Bearer {CHAT}") is None
    assert token_scope(f"Bearer {OPERATOR}") is Scope.OPERATOR


def test_no_more_than_the_cap_are_kept_and_the_rest_are_still_checked(configured, comparisons):
    # Distinct header values for one token (trailing spaces are stripped from the token).
    headers = [f"Bearer {CHAT}" + " " * n for n in range(tokens.MAX_ACCEPTED + 5)]
    assert all(token_scope(h) is Scope.CHAT for h in headers)
    assert len(tokens._accepted.checked[1]) == tokens.MAX_ACCEPTED
    before = len(comparisons)
    assert token_scope(headers[-1]) is Scope.CHAT  # not kept: checked in full again
    assert len(comparisons) > before


def test_no_header_and_a_missing_scheme_are_refused(configured):
    assert token_scope(None) is None
    assert token_scope("") is None
    assert token_scope(CHAT) is None  # no "Bearer "
