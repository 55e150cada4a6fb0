"""Test clocks: time that moves only when a test says so (`fleets.base.clock` is the injectable
one)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleets.base.clock import Clock


class FakeClock(Clock):
    """A clock that moves only when told to; for tests."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds=max(0.0, seconds))

    def advance(self, *, ms: float = 0, seconds: float = 0) -> None:
        delta = seconds + ms / 1000
        self._now += timedelta(seconds=delta)
        self._mono += delta
