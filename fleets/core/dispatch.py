"""When a periodic dispatch should tick a fleet, decided from its tick lease alone.

Every worker (Celery beat's fan-out, each server's or `reconcile --loop`'s in-process loop) asks
this once per interval for all fleets at once, instead of sending a tick per fleet that would
only find the lease busy. The lease stays the guard against two ticks at once; this only spares
the messages and the lease round-trips of ticks that would be skipped anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# A fleet whose last tick started less than this share of an interval ago was ticked by another
# worker (or a kick) a moment ago: its next periodic tick is one interval after that start.
# Counted from the start, not the release: a tick that takes longer than half an interval
# (a loaded machine) must not make every other beat skip the fleet.
RECENT_SHARE = 0.5
# The lease take's own version of that rule, for the in-process loop's periodic ticks
# (fleets/reconciler/locks.py): a fleet whose last tick, by any worker, started less than this
# share of an interval ago is passed over, and looked at again one interval after that start.
# Loops sharing the fleets then tick each fleet about once an interval between them, not once
# each: their schedules drift apart between two dispatch plans, and each plan only defers what
# was ticked in the half interval before it. Below 1, so a loop's own next beat (one interval
# after its last tick ended) is never passed over.
PERIODIC_SKIP_SHARE = 0.8


@dataclass(frozen=True)
class TickLeaseRow:
    """What the fleet's `tick:<id>` lease row says (no row: never ticked)."""

    holder: str
    expires_at: datetime | None
    acquired_at: datetime | None = None  # when the last (or current) holder took it


def tick_due_in(row: TickLeaseRow | None, *, now: datetime, interval_s: float) -> float:
    """Seconds from `now` until a periodic tick of the fleet is worth sending (0: now).

    Held, not run out: when the holder's lease runs out (a holder that died is taken over then,
    so a dead worker's fleets are ticked again within one lease). Given back, its tick started
    less than half an interval ago: one interval after that start. Otherwise (never held, ticked
    long enough ago, or a holder whose lease ran out): now.
    """
    if row is None:
        return 0.0
    if row.holder:
        if row.expires_at is None:
            return 0.0
        return max(0.0, (row.expires_at - now).total_seconds())
    if row.acquired_at is None:
        return 0.0
    since = (now - row.acquired_at).total_seconds()
    if since < interval_s * RECENT_SHARE:
        # A start stamped a little ahead of our clock (skew) counts as just now: never more
        # than one interval away.
        return interval_s - max(since, 0.0)
    return 0.0
