"""Fail fast while PostgreSQL cannot be reached at all: one attempt a second, every other
web request 503 at once (issue 29).

A stopped database (or a host that refuses or drops connections) used to cost every REST
request the whole pool timeout (HARU_DB_POOL_TIMEOUT_MS, 5 s) before its 503: psycopg_pool's
background attempts to reconnect fail, and a request waiting for a connection is not told;
/metrics paid it once per collector (20 s, past Prometheus' 10 s scrape timeout).

Every connection this process opens goes through `DeadlineConnection.connect`
(haru/postgres/deadline.py), which reports here whether it got one. After a failed attempt the
database counts as unreachable. Inside a web request (the same scope as the request deadline):

- while unreachable, one request a `PROBE_EVERY_S` tries a connection of its own (bounded by
  `connect_timeout`); every other fails at once with `DatabaseUnreachable`, an
  OperationalError that fleets/base/store_outage.py answers 503 `database_unavailable`;
- a request that waits for a pooled connection waits `FIRST_WAIT_S` first, then again only if
  no attempt failed meanwhile: the requests already waiting when the database went away
  answer within that, not after the pool timeout.

Any connection opened (by a probe or by the pool) makes the database reachable again. Outside
web requests (Celery ticks, commands, the chat proxy's store thread) nothing changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

log = logging.getLogger("haru.database")

# A refused connection costs the probe milliseconds; one a second keeps recovery within a
# second of the database's return without adding load to a database that is starting.
PROBE_EVERY_S = 1.0
# A stopped database fails the pool's first reconnection within milliseconds of its loss.
FIRST_WAIT_S = 0.5


class DatabaseUnreachable(psycopg.OperationalError):
    """The last attempt to connect failed: answered 503 without waiting for the pool."""


class Reachability:
    """Per process: whether the last connection attempt failed, and whose turn it is to probe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.reason = ""
        self._next_probe = 0.0
        self._refused = 0

    def opened(self) -> None:
        """A connection was opened: the database is reachable."""
        if self.down_since is None:
            return
        with self._lock:
            if self.down_since is None:
                return
            away, refused = self._clock() - self.down_since, self._refused
            self.down_since, self._refused = None, 0
        log.info(
            "database reachable again after %.1f s; %d requests answered 503 at once meanwhile",
            away,
            refused,
        )

    def failed(self, exc: BaseException) -> None:
        """An attempt to connect failed (refused, reset, timed out, authentication...)."""
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        with self._lock:
            self.reason = first_line
            if self.down_since is not None:
                return
            self.down_since = self._clock()
            self._next_probe = self.down_since + PROBE_EVERY_S
        log.warning(
            "database unreachable (%s): web requests get 503 at once until a connection opens",
            first_line,
        )

    def admit(self) -> bool:
        """Whether a web request may use the database: True when reachable; while unreachable
        True for the one request whose turn it is to probe (`probe` next); else raise."""
        if self.down_since is None:
            return True
        with self._lock:
            if self.down_since is None:
                return True
            now = self._clock()
            if now >= self._next_probe:
                self._next_probe = now + PROBE_EVERY_S
                return False  # this request probes
            self._refused += 1
            reason = self.reason
        raise DatabaseUnreachable(f"the database is unreachable ({reason})")

    def lend(self, pool: ConnectionPool) -> Any:
        """A connection from `pool`, given up early when an attempt to connect fails."""
        started = self._clock()
        try:
            return pool.getconn(timeout=min(FIRST_WAIT_S, pool.timeout))
        except PoolTimeout:
            if self.down_since is not None:
                raise DatabaseUnreachable(f"the database is unreachable ({self.reason})") from None
            left = pool.timeout - (self._clock() - started)
            if left <= 0:
                raise
        return pool.getconn(timeout=left)


REACHABILITY = Reachability()


def probe(pool: ConnectionPool, connect: Callable[..., Any]) -> None:
    """Try one connection of this request's own, with the pool's parameters; close it.

    The pool's own attempts back off (1, 2, 4 ... s): waiting for them would hold the request.
    A success marks the database reachable (in `connect`), and the request then borrows from
    the pool as usual; a failure raises DatabaseUnreachable.
    """
    # psycopg_pool takes either a value or a function giving it, for both.
    conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
    kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
    try:
        conn = connect(conninfo, **(kwargs or {}))
    except psycopg.OperationalError as exc:
        raise DatabaseUnreachable(f"the database is unreachable ({exc})") from exc
    conn.close()
