"""System checks on the configuration (`manage.py check`, and before `serve` starts).

A bearer token is the only thing between the network and promote/demote: one short enough to
guess is worth a warning at every start, not a silent acceptance.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Warning as CheckWarning

# 32 characters of `secrets.token_urlsafe` are ~190 bits; below this a token is guessable.
MIN_TOKEN_CHARS = 32


def short_tokens(app_configs: Any = None, **_kwargs: Any) -> list[CheckWarning]:
    """Warn for each configured token shorter than MIN_TOKEN_CHARS (never printing it)."""
    out = []
    for name, key in (
        ("HARU_API_TOKEN", "api_token"),
        ("HARU_SUPERVISOR_TOKEN", "supervisor_token"),
    ):
        token = settings.HARU[key]
        if token and len(token) < MIN_TOKEN_CHARS:
            out.append(
                CheckWarning(
                    f"{name} is {len(token)} characters; use at least {MIN_TOKEN_CHARS}",
                    hint="python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                    id="haru.W001",
                )
            )
    return out
