"""When a periodic dispatch should tick a fleet, decided from its tick lease alone.

Every worker (Celery beat's fan-out, each server's or `reconcile --loop`'s in-process loop) asks
this once per interval for all fleets at once, instead of sending a tick per fleet that would
only find the lease busy. The lease stays the guard against two ticks at once; this only spares
the messages and the lease round-trips of ticks that would be skipped anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# A fleet given back less than this share of an interval ago was ticked by another worker (or a
# kick) a moment ago: its next periodic tick is one interval after that one. Half an interval:
# a tick that ended late in the previous beat is never mistaken for this beat's.
RECENT_SHARE = 0.5


@dataclass(frozen=True)
class TickLeaseRow:
    """What the fleet's `tick:<id>` lease row says (no row: never ticked)."""

    holder: str
    expires_at: datetime | None


def tick_due_in(row: TickLeaseRow | None, *, now: datetime, interval_s: float) -> float:
    """Seconds from `now` until a periodic tick of the fleet is worth sending (0: now).

    Held, not run out: when the holder's lease runs out (a holder that died is taken over then,
    so a dead worker's fleets are ticked again within one lease). Given back less than half an
    interval ago: one interval after that tick. Otherwise (never held, given back long enough
    ago, or a holder whose lease ran out): now.
    """
    if row is None or row.expires_at is None:
        return 0.0
    since = (now - row.expires_at).total_seconds()
    if row.holder:
        return max(0.0, -since)
    if since < interval_s * RECENT_SHARE:
        # A release stamped a little ahead of our clock (skew) counts as just now: never more
        # than one interval away.
        return interval_s - max(since, 0.0)
    return 0.0
