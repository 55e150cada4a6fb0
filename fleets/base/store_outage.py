"""A database outage is not a bug: 503 with Retry-After, and one log line now and then.

Every reader of the store uses it: the REST API's exception handler (fleets/api/errors.py), a
scrape of /metrics (fleets/metrics/scrape.py, which may not import the API layer) and the
site-wide 500 handler, which Django calls for whatever escapes a view or a middleware (the
dashboard, admin, a session save). Without this, every request during an outage answered
500 `internal_error` and logged a full traceback.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse

from fleets.base.errors import ErrorCode
from fleets.base.private_apis import mark_response_logged

log = logging.getLogger("haru.database")

# Seconds a client should wait before retrying: about one pool timeout, so a retry does not
# arrive while the previous attempt is still waiting for a connection.
RETRY_AFTER_S = 5
LOG_EVERY_S = 10.0
MESSAGE = "the database is unavailable; retry later"


class _LogWindow:
    """When this process last logged an outage, and how many requests it has not logged since."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_logged = -LOG_EVERY_S
        self.suppressed = 0

    def due(self, now: float) -> int | None:
        """The requests to report with a line logged now, or None when one was logged lately."""
        with self.lock:
            if now - self.last_logged < LOG_EVERY_S:
                self.suppressed += 1
                return None
            suppressed, self.suppressed, self.last_logged = self.suppressed, 0, now
            return suppressed


_window = _LogWindow()


def is_database_outage(exc: BaseException | None) -> bool:
    """Connection refused, dropped or timed out, or the pool had none to lend in time.

    Django wraps driver errors as its own OperationalError/InterfaceError; psycopg's own are
    listed too for errors raised outside Django's wrapper (psycopg_pool's PoolTimeout is one).
    Integrity and programming errors stay 500s: they are bugs, not outages.
    """
    return isinstance(
        exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError
    )


def note(exc: BaseException) -> None:
    """Log the outage at most once per LOG_EVERY_S, counting the requests in between."""
    suppressed = _window.due(time.monotonic())
    if suppressed is None:
        return
    first_line = (str(exc).strip().splitlines() or [""])[0][:200]
    log.warning(
        "database unavailable (%s: %s); answering 503%s",
        type(exc).__name__,
        first_line,
        f" ({suppressed} more since the last report)" if suppressed else "",
    )


def _mark(response: HttpResponse) -> HttpResponse:
    response["Retry-After"] = str(RETRY_AFTER_S)
    # Logged above, once in a while: Django's per-request "Service Unavailable" line is not
    # needed (django.utils.log.log_response skips responses marked so).
    mark_response_logged(response)
    return response


def json_response() -> HttpResponse:
    return _mark(
        JsonResponse(
            {"error": {"code": ErrorCode.DATABASE_UNAVAILABLE, "message": MESSAGE}}, status=503
        )
    )


def html_response() -> HttpResponse:
    return _mark(
        HttpResponse(
            "<!doctype html><title>Haru: database unavailable</title>"
            "<h1>503 Service Unavailable</h1><p>The database is unavailable. This page will "
            "work again once it is back; retry in a few seconds.</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
    )
