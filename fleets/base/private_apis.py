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
    "counter_cell",
    "histogram_cells",
    "mark_response_logged",
    "psycopg_wait_has_timeout",
    "serializer_schema",
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
        "fleets/base/store_outage.py (an outage's 503 is logged once in a while, not per request)",
        source=('getattr(response, "_has_been_logged", False)',),
    ),
    Reliance(
        "django",
        "django.db.backends.postgresql.base:DatabaseWrapper",
        "fleets/proxy/store.py (the chat path's own connection, outside the pool)",
        source=("def pool(self):", "if self.pool:", "connection = self.pool.getconn()"),
    ),
    Reliance(
        "django",
        "django.db.backends.postgresql.base:DatabaseWrapper",
        "haru/postgres/base.py (a web request's pooled connection, lent by Haru's own wait)",
        source=(
            'isolation_level_value = options["isolation_level"]',
            "self.isolation_level = IsolationLevel.READ_COMMITTED",
            "self.pool.open()",
            "connection = self.pool.getconn()",
        ),
    ),
    Reliance(
        "prometheus-client",
        "prometheus_client.metrics:Counter",
        "fleets/metrics/requests.py (a batch of requests counted in one write)",
        source=("self._value = values.ValueClass(", "self._value.inc(amount)"),
    ),
    Reliance(
        "prometheus-client",
        "prometheus_client.metrics:Histogram",
        "fleets/metrics/requests.py (a batch of observations written in one write per cell)",
        source=(
            "self._upper_bounds = buckets",
            "self._sum = values.ValueClass(",
            "self._buckets.append(values.ValueClass(",
            "self._sum.inc(amount)",
            "if amount <= bound:",
            "self._buckets[i].inc(1)",
        ),
    ),
    Reliance(
        "drf-spectacular",
        "drf_spectacular.openapi:AutoSchema",
        "fleets/api/schema.py (a strict serializer's schema, then additionalProperties: false)",
        parameters={"_map_serializer": ("serializer", "direction", "bypass_extensions")},
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


def counter_cell(counter: Any) -> Any:
    """The value a prometheus_client counter (one labelled child) increments: `inc(n)` on it
    counts n at once (there is no public "observe many")."""
    return counter._value


def histogram_cells(histogram: Any) -> tuple[list[float], list[Any], Any]:
    """A prometheus_client histogram's (upper bounds, bucket values, sum value): an observation
    of x adds 1 to the first bucket whose bound is at least x, and x to the sum."""
    return histogram._upper_bounds, histogram._buckets, histogram._sum


def serializer_schema(auto_schema: Any, serializer: Any, direction: str) -> Any:
    """drf-spectacular's own schema of `serializer`, without the extension asking for it (its
    documented way for an extension to start from the default)."""
    return auto_schema._map_serializer(serializer, direction, bypass_extensions=True)


def session_user(request: Any) -> Any:
    """The user Django's session middleware put on the request a DRF `request` wraps; None if
    none (DRF's own `request.user` would run the authentication being written)."""
    return getattr(request._request, "user", None)
