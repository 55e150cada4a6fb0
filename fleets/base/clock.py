"""The one injectable clock that every time budget and timestamp uses.

Never the database's now(): budgets computed by the app and timestamps it writes must agree,
and tests script time by swapping the clock.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import overload

from fleets.core.timestamps import utc_iso


class Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Wait (a short, bounded pause between two checks); a fake clock just moves on."""
        time.sleep(max(0.0, seconds))


class _Installed:
    """The clock this process reads (tests install a fake one)."""

    __slots__ = ("clock",)

    def __init__(self) -> None:
        self.clock: Clock = Clock()


_installed = _Installed()


def get_clock() -> Clock:
    return _installed.clock


def set_clock(clock: Clock) -> Clock:
    """Install `clock` and return the previous one (tests restore it)."""
    previous, _installed.clock = _installed.clock, clock
    return previous


def now() -> datetime:
    return _installed.clock.now()


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: None) -> None: ...
@overload
def iso(value: datetime | None) -> str | None: ...
def iso(value: datetime | None) -> str | None:
    """Render a datetime as RFC 3339 UTC with a Z (`fleets.core.timestamps.utc_iso`), the
    timestamp format of every API body and event; None stays None."""
    return utc_iso(value) if value is not None else None
