"""The API token checks shared by the REST API and the chat proxy.

Two scopes: the operator token (HARU_API_TOKEN) may call everything; a chat token
(HARU_CHAT_TOKENS) may call only the OpenAI-compatible chat endpoints, so a token handed to an
application cannot promote, demote or read the fleet. At the bottom of the layers (it reads only
the settings), so the proxy authenticates without importing the REST API and DRF. Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from enum import Enum

from common.bearer import bearer_credential
from fleets.base.conf import haru_settings
from fleets.base.setting_table import HaruSettings


class Scope(Enum):
    OPERATOR = "operator"
    CHAT = "chat"


# Authorization headers that carried a known token, with their scope, kept with the settings
# object they were checked against (a settings change starts a new dict; a check that raced it
# adds to the old one). The chat path checks one header per request, and a client sends the
# same one every time: the parse and the constant-time comparisons (one per configured token)
# are then a dictionary lookup. Only accepted headers are kept, so guessing adds nothing; a
# lookup compares a guess with a kept header only when their (per-process, randomly keyed)
# hashes are equal, which says nothing about the token.
class _Accepted:
    __slots__ = ("checked",)

    def __init__(self) -> None:
        # (the settings object, the headers accepted under it): replaced as one value.
        self.checked: tuple[HaruSettings | None, dict[str, Scope]] = (None, {})


_accepted = _Accepted()
MAX_ACCEPTED = 64  # distinct accepted headers kept; past it each is checked in full


def token_scope(header: str | None) -> Scope | None:
    """Return the scope of the token an Authorization header carries (None: no known token)."""
    config = haru_settings()
    checked_for, accepted = _accepted.checked
    if checked_for is not config:
        accepted = {}
        _accepted.checked = (config, accepted)
    if header is None:
        return None
    scope = accepted.get(header)
    if scope is None:
        # The one parse every gate shares, the supervisor's included (common/bearer.py).
        scope = _scope_of(bearer_credential(header), config)
        if scope is not None and len(accepted) < MAX_ACCEPTED:
            accepted[header] = scope
    return scope


def _scope_of(presented: str | None, config: HaruSettings) -> Scope | None:
    if presented is None:
        return None
    raw = presented.encode()
    expected = config.api_token
    if expected and hmac.compare_digest(raw, expected.encode()):
        return Scope.OPERATOR
    # Every chat token is compared, so the time taken does not say which one was close.
    matched = False
    for token in config.chat_tokens:
        matched |= hmac.compare_digest(raw, token.encode())
    return Scope.CHAT if matched else None


def chat_auth_required() -> bool:
    """Whether the chat endpoints need a token: any token configured turns it on."""
    config = haru_settings()
    return bool(config.api_token or config.chat_tokens)


def chat_allowed(header: str | None) -> bool:
    """Whether a request may call the chat endpoints (operator and chat tokens both may)."""
    return not chat_auth_required() or token_scope(header) is not None
