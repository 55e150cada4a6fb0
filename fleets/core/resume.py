"""An operation interrupted by the control plane's absence: when it counts as away, and where
its step's clock stands on its return.

A step's duration and budget measure the time the control plane drove it. While nobody held
the fleet (the control plane stopped, crashed or lost its hosts' rack with it) nothing drove
the step, so its clock resumes where it stood: a trainer stop that took 2 s before a minute of
downtime is recorded as 2 s, not 62 s, and is not timed out for the minute. The outage clients
saw is another figure (from the operation's `detectedAt` to the routing commit) and keeps the
whole absence.
"""

from __future__ import annotations

from datetime import datetime, timedelta


def away_for(last_held_at: datetime | None, now: datetime, away_after: timedelta) -> timedelta:
    """How long the fleet went unheld before `now`, when that counts as the control plane being
    away (longer than `away_after`); zero otherwise, or when it was never held."""
    if last_held_at is None:
        return timedelta(0)
    gap = now - last_held_at
    return gap if gap > away_after else timedelta(0)


def resumed_step_start(
    step_started_at: datetime, last_held_at: datetime, now: datetime
) -> datetime:
    """Where a step's start moves so that its clock resumes at `now` with what it had run by
    `last_held_at` (a step started after that moment restarts from zero)."""
    ran = max(last_held_at - step_started_at, timedelta(0))
    return now - ran
