"""Lease rows: take, renew and release a named claim with conditional UPDATEs.

Every statement is a single autocommit UPDATE (or the INSERT that creates the row once), so no
session state is involved: a transaction-mode pooler may hand each statement to another server
connection. Times come from the control plane's clock (`fleets.base.clock`), as every other deadline
Haru writes; the hosts taking leases must keep their clocks within a small fraction of the
lease's length of each other (NTP does far better).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from fleets.models import Lease

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Taken:
    """The outcome of one attempt: whether it was taken, from whom, and until when it is held."""

    acquired: bool
    expires_at: datetime | None  # acquired: our deadline; not acquired: the holder's
    taken_over_from: str = ""  # acquired from a holder whose lease had run out (or was dead)
    holder: str = ""  # not acquired: who holds it
    # Acquired: the last moment a previous holder is known to have held it (None: never held,
    # or given back before release times were kept). See `_last_held`.
    last_held_at: datetime | None = None


def _last_held(row: dict[str, Any] | None, ttl: timedelta) -> datetime | None:
    """When a holder last held the lease, as far as its row tells.

    Given back: the moment of release (`lease_release` keeps it as the expiry). Still named (a
    holder that died or froze): its last take or renewal; each renewal pushes the expiry one
    lease length ahead, so that is the expiry less one length (ours: lengths rarely change).
    """
    if row is None:
        return None
    released: datetime | None = row["expires_at"]
    if not row["holder"]:
        return released
    seen: list[datetime | None] = [row["acquired_at"]]
    if row["expires_at"] is not None:
        seen.append(row["expires_at"] - ttl)
    return max((t for t in seen if t is not None), default=None)


def lease_acquire(
    *, name: str, holder: str, now: datetime, ttl: timedelta, dead_holder: str = ""
) -> Taken:
    """Take the lease `name` for `holder` until `now + ttl` if it is free or has expired.

    `dead_holder`: a holder the caller knows is gone (a process of this host that no longer
    exists); its lease is taken at once, still guarded by that exact holder being the one on
    the row.
    """
    until = now + ttl
    fields = ("holder", "expires_at", "acquired_at")
    previous = Lease.objects.filter(name=name).values(*fields).first()
    if previous is None:
        try:
            with transaction.atomic():
                Lease.objects.create(name=name, holder=holder, expires_at=until, acquired_at=now)
            return Taken(True, until)
        except IntegrityError:
            # Created by another taker between our read and our insert: fall through to the
            # conditional UPDATE, which decides against the row as it is now.
            previous = Lease.objects.filter(name=name).values(*fields).first()
    free = Q(holder="") | Q(expires_at__isnull=True) | Q(expires_at__lt=now)
    if dead_holder:
        free |= Q(holder=dead_holder)
    taken = (
        Lease.objects.filter(name=name)
        .filter(free)
        .update(holder=holder, expires_at=until, acquired_at=now)
    )
    if taken:
        stale_holder = ""
        if previous is not None and previous["holder"]:
            expired = previous["expires_at"] is not None and previous["expires_at"] < now
            if expired or previous["holder"] == dead_holder:
                stale_holder = previous["holder"]
        if stale_holder:
            log.warning(
                "lease %s: taken over from %s (%s)",
                name,
                stale_holder,
                "gone" if stale_holder == dead_holder else "expired",
            )
        held = _last_held(previous, ttl)
        return Taken(True, until, stale_holder, last_held_at=held and min(held, now))
    current = Lease.objects.filter(name=name).values("holder", "expires_at").first()
    if current is None:
        return Taken(False, None)
    return Taken(False, current["expires_at"], holder=current["holder"])


def lease_renew(*, name: str, holder: str, now: datetime, ttl: timedelta) -> datetime | None:
    """Extend `holder`'s lease to `now + ttl`; None if it is no longer theirs.

    Guarded by the holder only: a lease that ran out but that nobody took is still ours to
    extend, because nobody acted in between. One that was taken over stays lost.
    """
    until = now + ttl
    moved = Lease.objects.filter(name=name, holder=holder).update(expires_at=until)
    return until if moved else None


def lease_release(*, name: str, holder: str, now: datetime | None = None) -> bool:
    """Give the lease back at once (only if `holder` still has it).

    `now`: the moment it is given back, kept as its expiry (a free lease either way) so the
    next taker knows when it was last held (`Taken.last_held_at`).
    """
    released = Lease.objects.filter(name=name, holder=holder).update(holder="", expires_at=now)
    return bool(released)
