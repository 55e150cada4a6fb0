"""The private interfaces of Django, Django REST framework, psycopg and psycopg_pool that the
control plane relies on, in one place.

The server-only half of common/private_apis.py (which says why these exist and how they are
checked): every private name of these dependencies is touched here and nowhere else, and
`RELIED_ON` lists what of it is relied on, checked by tests/tools/test_private_apis.py against
the installed versions. docs/private-apis.md says why no public API does each.
"""

from __future__ import annotations

import inspect
from typing import Any

import psycopg
import psycopg.errors

from common.private_apis import Reliance

__all__ = [
    "RELIED_ON",
    "WAIT_TIMEOUT",
    "mark_response_logged",
    "psycopg_wait_has_timeout",
    "session_user",
    "unpooled",
]

RELIED_ON: list[Reliance] = [
    Reliance(
        "psycopg",
        "psycopg.errors:_WaitTimeout",
        "haru/postgres/deadline.py (what Connection.wait raises when its timeout passes)",
    ),
    Reliance(
        "psycopg",
        "psycopg:Connection",
        "haru/postgres/deadline.py (every round trip's wait, bounded by the request's deadline)",
        parameters={"wait": ("gen", "interval", "timeout")},
    ),
    Reliance(
        "psycopg-pool",
        "psycopg_pool.pool:ConnectionPool",
        "haru/postgres/deadline.py (CutConnectionFilter: the connection is the record's 1st arg)",
        source=('logger.warning("discarding closed connection: %s", conn)',),
    ),
    Reliance(
        "django",
        "django.utils.log:log_response",
        "fleets/api/outage.py (an outage's 503 is logged once in a while, not per request)",
        source=('getattr(response, "_has_been_logged", False)',),
    ),
    Reliance(
        "django",
        "django.db.backends.postgresql.base:DatabaseWrapper",
        "fleets/proxy/store.py (the chat path's own connection, outside the pool)",
        source=("def pool(self):", "if self.pool:", "connection = self.pool.getconn()"),
    ),
    Reliance(
        "djangorestframework",
        "rest_framework.request:Request",
        "fleets/api/auth.py (the session's user, before DRF's own authentication runs)",
        source=("self._request = request",),
    ),
]

# The exception psycopg's Connection.wait raises when its `timeout` passes (psycopg >= 3.3.9);
# None before that version (haru/postgres/deadline.py refuses to load then).
WAIT_TIMEOUT: type[Exception] | None = getattr(psycopg.errors, "_WaitTimeout", None)


def psycopg_wait_has_timeout() -> bool:
    """Whether this psycopg's Connection.wait takes a timeout and says when it passed."""
    return (
        WAIT_TIMEOUT is not None
        and "timeout" in inspect.signature(psycopg.Connection.wait).parameters
    )


def mark_response_logged(response: Any) -> None:
    """Keep Django's per-request log line for `response` out (django.utils.log.log_response)."""
    response._has_been_logged = True


def unpooled(wrapper: Any) -> Any:
    """A database connection wrapper like `wrapper` (its class, its very settings dict, its
    alias) that connects directly instead of borrowing from Django's pool."""
    cls = type("UnpooledDatabaseWrapper", (type(wrapper),), {"pool": None})
    return cls(wrapper.settings_dict, wrapper.alias)


def session_user(request: Any) -> Any:
    """The user Django's session middleware put on the request a DRF `request` wraps; None if
    none (DRF's own `request.user` would run the authentication being written)."""
    return getattr(request._request, "user", None)
