"""The shape of a stored API token, which the edge checks without the database."""

from __future__ import annotations

import secrets

import pytest

from fleets.core.access import STORED_TOKEN_PREFIX, stored_token_shaped


def test_a_freshly_made_secret_has_the_shape():
    for _ in range(50):
        assert stored_token_shaped(STORED_TOKEN_PREFIX + secrets.token_urlsafe(32))


@pytest.mark.parametrize(
    "secret",
    [
        "",
        STORED_TOKEN_PREFIX,
        STORED_TOKEN_PREFIX + "A" * 42,  # one short
        STORED_TOKEN_PREFIX + "A" * 44,  # one long
        STORED_TOKEN_PREFIX + "A" * 42 + "=",  # padded base64 is not what token_urlsafe writes
        STORED_TOKEN_PREFIX + "A" * 42 + "/",  # the standard alphabet, not the URL-safe one
        "HARU_" + "A" * 43,
        "x" + STORED_TOKEN_PREFIX + "A" * 42,
    ],
)
def test_anything_else_has_not(secret):
    assert not stored_token_shaped(secret)
