"""One scrape's reads of the state store: served what it can, says what it cannot (issue 29).

Each scrape-time collector reads the database through `read_store`. With the database down, the
first read that meets the outage ends every database read of that scrape: the later collectors
skip theirs instead of each waiting for the pool and logging a traceback (a scrape with
PostgreSQL stopped took 20 s, past Prometheus' 10 s timeout, with a traceback per collector).
The outage is logged as the REST API logs it (fleets/base/store_outage.py: one line at most every
10 s), `haru_state_store_up` reads 0, and the per-process series are served as usual. While the
database is known unreachable, a read fails at once (haru/postgres/reachability.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

from fleets.base import store_outage as outage

log = logging.getLogger(__name__)
T = TypeVar("T")


class Scrape:
    """A scrape under way: whether its reads already found the database away."""

    __slots__ = ("failed", "shared", "store_down")

    def __init__(self) -> None:
        self.store_down = False
        # The reads that failed otherwise (a bug): a snapshot is not replaced by a partial one.
        self.failed: list[str] = []
        self.shared: dict[str, object] = {}


_current: ContextVar[Scrape | None] = ContextVar("haru_metrics_scrape", default=None)


class scope:  # noqa: N801 - used as a function: `with scrape.scope():`
    """Share one `Scrape` between the collectors run inside the block (one /metrics answer)."""

    __slots__ = ("_token",)

    def __enter__(self) -> Scrape:
        current = Scrape()
        self._token = _current.set(current)
        return current

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._token)


def read_store(what: str, read: Callable[[], T]) -> T | None:
    """Run one collector's database reads; None when they cannot be made (`what` names them).

    A database outage is noted once for the scrape and skips every later read; any other error
    (a bug) is logged with its traceback and skips this collector only.
    """
    current = _current.get()
    if current is not None and current.store_down:
        return None
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - a scrape must answer whatever the store does
        if outage.is_database_outage(exc):
            if current is not None:
                current.store_down = True
            outage.note(exc)
        else:
            log.warning("metrics: %s unreadable", what, exc_info=True)
            if current is not None:
                current.failed.append(what)
        return None


def shared(key: str, read: Callable[[], T]) -> T:
    """What `read` returns, read once per scrape for every collector that asks by `key` (the
    rows of every fleet: several collectors judge them, one read is enough); read afresh
    outside a scrape."""
    current = _current.get()
    if current is None:
        return read()
    if key not in current.shared:
        current.shared[key] = read()
    return current.shared[key]  # type: ignore[return-value]
