"""System checks on the configuration (`manage.py check`, and before `serve` starts).

A bearer token is the only thing between the network and promote/demote: one short enough to
guess is worth a warning at every start, not a silent acceptance. No check ever prints a token.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage
from django.core.checks import Error as CheckError
from django.core.checks import Warning as CheckWarning

from fleets.base.conf import haru_settings

# 32 characters of `secrets.token_urlsafe` are ~190 bits; below this a token is guessable.
MIN_TOKEN_CHARS = 32


def short_tokens(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Warn for each configured token shorter than MIN_TOKEN_CHARS (never printing it)."""
    named: list[tuple[str, str | None]] = [
        ("HARU_API_TOKEN", haru_settings().api_token),
        ("HARU_SUPERVISOR_TOKEN", haru_settings().supervisor_token),
        ("HARU_SUPERVISOR_MASTER_KEY", haru_settings().supervisor_master_key),
    ]
    named += [
        (f"HARU_CHAT_TOKENS item {i + 1}", t) for i, t in enumerate(haru_settings().chat_tokens)
    ]
    out: list[CheckMessage] = []
    for name, token in named:
        if token and len(token) < MIN_TOKEN_CHARS:
            out.append(
                CheckWarning(
                    f"{name} is {len(token)} characters; use at least {MIN_TOKEN_CHARS}",
                    hint="python -c 'import secrets; print(secrets.token_urlsafe(32))'",
                    id="haru.W001",
                )
            )
    return out


def shared_supervisor_token(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Warn while the deprecated shared supervisor token is configured (migration period)."""
    if not haru_settings().supervisor_token:
        return []
    if haru_settings().supervisor_master_key:
        return [
            CheckWarning(
                "HARU_SUPERVISOR_TOKEN (one token for every supervisor) is still set next to "
                "HARU_SUPERVISOR_MASTER_KEY: a supervisor that refuses its own token is sent the "
                "shared one",
                hint="give each supervisor its token (manage.py supervisor_token "
                "<fleet>/<domain>), then unset HARU_SUPERVISOR_TOKEN",
                id="haru.W002",
            )
        ]
    return [
        CheckWarning(
            "HARU_SUPERVISOR_TOKEN is deprecated: every supervisor gets the same token, so any "
            "one of them (or a host a supervisorUrl points at) holds the credential for all",
            hint="set HARU_SUPERVISOR_MASTER_KEY, give each supervisor its own token "
            "(manage.py supervisor_token <fleet>/<domain>), then unset HARU_SUPERVISOR_TOKEN",
            id="haru.W002",
        )
    ]


def scoped_tokens(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """Refuse chat tokens that would not scope anything: with the REST API open, or equal to
    the operator token."""
    chat = haru_settings().chat_tokens
    if not chat:
        return []
    operator = haru_settings().api_token
    if not operator:
        return [
            CheckError(
                "HARU_CHAT_TOKENS is set but HARU_API_TOKEN is not: the REST API (promote, "
                "demote, layouts) would be open to anyone while chat needs a token",
                hint="set HARU_API_TOKEN (the operator token) as well",
                id="haru.E001",
            )
        ]
    if operator in chat:
        return [
            CheckError(
                "HARU_CHAT_TOKENS contains HARU_API_TOKEN: the operator token must not double "
                "as a chat token",
                hint="give chat clients a token of their own",
                id="haru.E002",
            )
        ]
    return []
