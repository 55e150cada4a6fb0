"""A deadline on every database wait of a web request, and fail-fast while the database is frozen.

A PostgreSQL whose processes are all stopped (SIGSTOP, a hung host, a storage stall) still has
a kernel that accepts and acknowledges: libpq has no client-side query deadline and TCP
keepalives never fire, so a query, or the pool's check of a connection before lending it,
waits for as long as the database is frozen. Every REST, dashboard and admin request held a
thread and a pooled connection until it thawed, answering neither 503 nor 500.

The mechanism is psycopg's own timed wait: every database round trip of a psycopg connection goes
through `Connection.wait`, which (psycopg >= 3.3.9) takes a `timeout` and raises a private error
when it passes (WAIT_TIMEOUT, fleets/base/private_apis.py). `DeadlineConnection` (the pool's
connection class) passes the request's budget there when the wait happens inside a web request
(`scope`, opened by `haru.postgres.middleware.RequestDeadlineMiddleware`) and nothing otherwise, so
migrations, `seed_layout`, retention pruning, Celery ticks and the chat proxy's own store thread are
never cut. It needs no watchdog thread and no socket shut down from outside: the blocked call itself
returns at the deadline. When it does, the connection is closed at once (its query may still be
running, its state is unknown: it must never be lent again) and `DatabaseNotAnswering` (an
OperationalError) is raised, which `fleets/base/store_outage.py` answers as it answers a stopped
database: 503 `database_unavailable` with Retry-After.

Once one wait has passed its deadline the process assumes the database is frozen (`Breaker`):
one request at a time is let through to try it, every other web request fails at once with the
same 503, before it queues for a pooled connection, and the first wait that gets an answer
(any thread's) lets everything through again. So a freeze costs each request at most about one
deadline, and the server recovers by itself when the database thaws.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.abc import RV, PQGen

from fleets.base.private_apis import WAIT_TIMEOUT, psycopg_wait_has_timeout
from haru.postgres import reachability

log = logging.getLogger("haru.database")

# psycopg's own default interval between wake-ups of a wait (to notice Ctrl-C).
_INTERVAL = 0.1
if WAIT_TIMEOUT is None or not psycopg_wait_has_timeout():
    raise ImportError(
        "haru.postgres needs psycopg >= 3.3.9 (Connection.wait with a timeout); "
        f"installed: {psycopg.__version__}"
    )
# What a wait raises when its timeout passes (narrowed by the check above).
_TIMED_OUT: type[Exception] = WAIT_TIMEOUT

FAIL_FAST = (
    "the database is not answering (a request's deadline passed); failing fast until it does"
)


class DatabaseNotAnswering(psycopg.OperationalError):
    """No answer within the request's deadline, or failing fast while the database is frozen."""


class RequestBudget:
    """One web request's view of the database: each wait may take `wait_s`."""

    __slots__ = ("cut", "wait_s")

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        # A deadline passed in this request: its other waits fail at once (its answer is 503).
        self.cut = False


_current: ContextVar[RequestBudget | None] = ContextVar("haru_db_request", default=None)


class scope:  # noqa: N801 - used as a function: `with deadline.scope(s):`
    """Bound every database wait inside the block (a web request) by `wait_s` seconds.

    A class, not @contextmanager: it runs once per request, and a generator costs more.
    """

    __slots__ = ("_token", "budget")

    def __init__(self, wait_s: float) -> None:
        self.budget = RequestBudget(wait_s)

    def __enter__(self) -> RequestBudget:
        self._token = _current.set(self.budget)
        return self.budget

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._token)
        BREAKER.release(self.budget)


def current() -> RequestBudget | None:
    """The web request's budget, None outside web requests (no deadline there)."""
    return _current.get()


class Breaker:
    """Per process: after a deadline passed, one request at a time tries the database.

    Closed (the usual state) it costs one attribute read per wait. Tripped, the first request
    to arrive becomes the probe and waits as usual (within its deadline); the others fail at
    once. Any wait that gets an answer closes it again.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.tripped_at: float | None = None
        self._probe: RequestBudget | None = None
        self._failed_fast = 0

    def admit(self, budget: RequestBudget) -> None:
        """Return if `budget`'s request may wait on the database; else DatabaseNotAnswering."""
        if budget.cut:
            raise DatabaseNotAnswering(FAIL_FAST)
        if self.tripped_at is None:
            return
        with self._lock:
            if self.tripped_at is None or self._probe is budget:
                return
            if self._probe is None:
                self._probe = budget
                return
            self._failed_fast += 1
        raise DatabaseNotAnswering(FAIL_FAST)

    def trip(self, budget: RequestBudget) -> None:
        """`budget`'s request waited its whole deadline without an answer."""
        budget.cut = True
        with self._lock:
            if self.tripped_at is None:
                self.tripped_at = self._clock()
            if self._probe is budget:
                self._probe = None

    def answered(self) -> None:
        """A wait got its answer: the database is back (if it was ever away)."""
        if self.tripped_at is None:
            return
        with self._lock:
            if self.tripped_at is None:
                return
            away, failed = self._clock() - self.tripped_at, self._failed_fast
            self.tripped_at, self._probe, self._failed_fast = None, None, 0
        log.info(
            "database answering again, %.1f s after a request's deadline passed; "
            "%d requests failed fast meanwhile",
            away,
            failed,
        )

    def release(self, budget: RequestBudget) -> None:
        """`budget`'s request ended: if it was the probe, the next request may try."""
        if self._probe is budget:
            with self._lock:
                if self._probe is budget:
                    self._probe = None


BREAKER = Breaker()


def admit() -> None:
    """Fail fast, before queueing for a pooled connection, while the database is frozen.

    Called where Django opens a connection (haru/postgres/base.py): the pool's own wait for a
    connection is bounded by HARU_DB_POOL_TIMEOUT_MS, but a request that need not wait should
    not take a place in its queue. A no-op outside web requests.
    """
    budget = _current.get()
    if budget is not None:
        BREAKER.admit(budget)


# psycopg's own wait, called directly: this runs on every round trip of every connection.
_wait = psycopg.Connection.wait


class DeadlineConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits inside a web request end at the request's deadline."""

    @classmethod
    def connect(cls, *args: Any, **kwargs: Any) -> Any:
        # Every connection this process opens (the pool's, a probe's): whether the database
        # could be reached at all (reachability.py). A server that answered with an error
        # (too many clients, starting up, a wrong password) was reached: not counted.
        try:
            conn = super().connect(*args, **kwargs)
        except psycopg.OperationalError as exc:
            if exc.sqlstate is None:
                reachability.REACHABILITY.failed(exc)
            raise
        reachability.REACHABILITY.opened()
        return conn

    # Closed here after a deadline: the pool's "discarding closed connection" line is ours
    # to report (once per outage, fleets/base/store_outage.py), not once per connection.
    cut_by_deadline = False

    def wait(self, gen: PQGen[RV], interval: float = _INTERVAL, timeout: float | None = None) -> RV:
        budget = _current.get()
        if budget is None:
            result = _wait(self, gen, interval, timeout)
            if BREAKER.tripped_at is not None:
                BREAKER.answered()
            return result
        try:
            BREAKER.admit(budget)
        except DatabaseNotAnswering:
            # Nothing was sent, but Django may check the connection after this error with a
            # query of its own outside the request's deadline: never leave it one to wait on.
            self._cut()
            raise
        limit = budget.wait_s if timeout is None else min(timeout, budget.wait_s)
        try:
            result = _wait(self, gen, interval, limit)
        except _TIMED_OUT:
            if timeout is not None and timeout <= budget.wait_s:
                raise  # the caller's own, shorter timeout
            self._cut()
            BREAKER.trip(budget)
            raise DatabaseNotAnswering(
                f"the database did not answer within {budget.wait_s * 1000:.0f} ms "
                "(HARU_DB_REQUEST_DEADLINE_MS)"
            ) from None
        if BREAKER.tripped_at is not None:
            BREAKER.answered()
        return result

    def _cut(self) -> None:
        """Close the connection now: a query may be in flight, its state is unknown."""
        self.cut_by_deadline = True
        # PQfinish: a Terminate message into the socket's send buffer and close; nothing
        # waits on the frozen server.
        self.pgconn.finish()


class CutConnectionFilter(logging.Filter):
    """Drop psycopg_pool's per-connection warning for the connections closed here."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            isinstance(args, tuple) and args and getattr(args[0], "cut_by_deadline", False) is True
        )
