"""Backoff for failed automatic failovers, per target domain.

Pure: the caller passes the fleet's recent automatic promotions (newest first) and the clock.
A standby whose promotion keeps failing (its probe fails, its wake hangs) must not be stopped,
woken, slept and restarted on every tick: each failure doubles the wait before that standby is
tried again, up to a cap, and a success anywhere in the fleet ends the episode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from fleets.core.policy import Policy
from fleets.core.states import OperationState

# Attempts that count as failed: an operator's cancel counts too, or the very next tick would
# request the same promotion again and the cancel would not stick.
_FAILED = frozenset({OperationState.FAILED, OperationState.CANCELLED})
# 2**20 times any base is past MAX_MS: more doublings cannot change the capped delay.
_MAX_DOUBLINGS = 20


@dataclass(frozen=True)
class Attempt:
    """One finished or in-flight automatic promotion: its target, state and end time."""

    target_id: str
    state: str
    finished_at: datetime | None


@dataclass(frozen=True)
class Backoff:
    """A target held back: `failures` in a row, the last at `last_failed_at`."""

    target_id: str
    failures: int
    last_failed_at: datetime
    next_attempt_at: datetime


def backoff_delay_ms(failures: int, policy: Policy) -> int:
    """Return the wait after `failures` consecutive failures (0 for none), capped."""
    if failures <= 0:
        return 0
    doublings = min(failures - 1, _MAX_DOUBLINGS)
    delay: int = policy.failover_backoff_ms << doublings
    return min(policy.failover_backoff_max_ms, delay)


def failover_backoffs(attempts: Iterable[Attempt], policy: Policy) -> dict[str, Backoff]:
    """Return each target's backoff from the fleet's automatic promotions, newest first.

    A target's run of failures counts back from its newest attempt and stops at anything that
    did not fail; a succeeded promotion of any target ends every run (the episode is over).
    """
    runs: dict[str, list[datetime]] = {}
    closed: set[str] = set()
    for attempt in attempts:
        if attempt.state == OperationState.SUCCEEDED:
            break
        if attempt.target_id in closed:
            continue
        if attempt.state not in _FAILED or attempt.finished_at is None:
            closed.add(attempt.target_id)
            continue
        runs.setdefault(attempt.target_id, []).append(attempt.finished_at)
    out: dict[str, Backoff] = {}
    for target, failures in runs.items():
        last = max(failures)
        delay = timedelta(milliseconds=backoff_delay_ms(len(failures), policy))
        out[target] = Backoff(target, len(failures), last, last + delay)
    return out


def held_targets(backoffs: Mapping[str, Backoff], now: datetime) -> dict[str, datetime]:
    """Return the targets still waiting at `now`, with when each may be tried again."""
    return {t: b.next_attempt_at for t, b in backoffs.items() if b.next_attempt_at > now}
