"""Which bearer token Haru sends to (and provisions for) each domain's supervisor.

HARU_SUPERVISOR_MASTER_KEY set: each domain's own token, derived from the key and the domain's id
(`fleets.core.credentials`); nothing is stored, and a domain's supervisor never sees another
domain's token or the key. HARU_SUPERVISOR_TOKEN, the old token shared by every supervisor, is
still honoured for a migration period, with a system check warning and one log line per process:
alone, it is sent to every supervisor as before; next to the master key, it is sent only to a
supervisor that refused its own token (one not yet given it), and that is logged once per domain.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from dataclasses import dataclass

from fleets.base.conf import haru_settings
from fleets.core.credentials import derive_supervisor_token

log = logging.getLogger(__name__)

MASTER_KEY_ENV = "HARU_SUPERVISOR_MASTER_KEY"
LEGACY_TOKEN_ENV = "HARU_SUPERVISOR_TOKEN"


class _Warned:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: set[str] = set()


@functools.cache
def _warned() -> _Warned:
    """The warnings this process logged (a test starts afresh with `_warned.cache_clear()`)."""
    return _Warned()


@dataclass(frozen=True)
class SupervisorCredentials:
    """The token to send first and, during the migration, the shared one to try after a 401."""

    token: str | None
    fallback: str | None = None


def supervisor_token_for(domain_id: uuid.UUID | str) -> str | None:
    """Return the token domain `domain_id`'s supervisor must require (what provisioning gives
    the node): its derived token, else the deprecated shared one, else None."""
    key = haru_settings().supervisor_master_key
    if key:
        return derive_supervisor_token(key, domain_id)
    legacy = haru_settings().supervisor_token
    if legacy:
        warn_once(
            "legacy",
            f"{LEGACY_TOKEN_ENV} is one token for every supervisor and is deprecated: set "
            f"{MASTER_KEY_ENV} so each domain gets its own (docs/api.md, 'Credentials')",
        )
    return legacy


def credentials_for(domain_id: uuid.UUID | str) -> SupervisorCredentials:
    """Return what the control plane's client sends to domain `domain_id`'s supervisor."""
    token = supervisor_token_for(domain_id)
    legacy = haru_settings().supervisor_token
    if haru_settings().supervisor_master_key and legacy and legacy != token:
        return SupervisorCredentials(token, fallback=legacy)
    return SupervisorCredentials(token)


def warn_once(key: str, message: str) -> None:
    """Log `message` once per process for `key` (never a token: callers pass none)."""
    warned = _warned()
    with warned.lock:
        if key in warned.keys:
            return
        warned.keys.add(key)
    log.warning(message)
