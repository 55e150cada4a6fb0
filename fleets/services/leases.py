"""Lease rows: take, renew and release a named claim with conditional UPDATEs.

Every statement is a single autocommit UPDATE (or the INSERT that creates the row once), so no
session state is involved: a transaction-mode pooler may hand each statement to another server
connection. A take is one UPDATE ... RETURNING (the row's previous holder and times come back
from the same statement), a give-back one more: a tick costs two statements and two row writes.
Times come from the control plane's clock (`fleets.base.clock`), as every other deadline Haru
writes; the hosts taking leases must keep their clocks within a small fraction of the
lease's length of each other (NTP does far better).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils.dateparse import parse_datetime

from fleets.base import prepared
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
    # Acquired: the row's `sightings` as the take found them (raw, as the database returns
    # them: `fleets.reads.sightings.decode` reads them).
    sightings: Any = None
    # Not acquired because given back by a take since the caller's `recent`: that take's time.
    recent_at: datetime | None = None


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


def _take_sql() -> str:
    table = connection.ops.quote_name(Lease._meta.db_table)
    # One statement: the row's previous values are copied aside by the same UPDATE (SET reads
    # the row as it was) and returned, so a take needs no read first. Guarded by "free, run out,
    # or held by the holder the caller knows is dead": two takers racing, one matches.
    return (
        f"UPDATE {table} SET previous_holder = holder, previous_expires_at = expires_at, "  # noqa: S608 - names from the model, values bound
        "previous_acquired_at = acquired_at, holder = %s, expires_at = %s, acquired_at = %s "
        "WHERE name = %s AND (holder = '' OR expires_at IS NULL OR expires_at < %s OR holder = %s) "
        # A periodic take passes over a lease given back by a take since `recent` (another
        # worker's tick a moment ago); any other take passes a `recent` no take can follow.
        "AND NOT (holder = '' AND COALESCE(acquired_at > %s, FALSE)) "
        "RETURNING previous_holder, previous_expires_at, previous_acquired_at, sightings"
    )


def _as_datetime(value: Any) -> datetime | None:
    """A timestamp read by a raw statement: SQLite hands back naive UTC (text or datetime),
    PostgreSQL an aware datetime."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _take(
    name: str,
    holder: str,
    now: datetime,
    until: datetime,
    dead_holder: str,
    recent: datetime | None,
) -> Any:
    """Run the take; return the row as it was before (holder, expires, acquired) with its
    sightings, or None."""
    adapt = connection.ops.adapt_datetimefield_value
    # No `recent`: a moment no take can have followed (the statement stays one prepared shape).
    since = recent if recent is not None else until + _NEVER
    with prepared.cursor() as cursor:  # every tick's take: planned once per connection
        cursor.execute(
            _take_sql(),
            [holder, adapt(until), adapt(now), name, adapt(now), dead_holder, adapt(since)],
        )
        return cursor.fetchone()


_NEVER = timedelta(days=3650)


def lease_acquire(
    *,
    name: str,
    holder: str,
    now: datetime,
    ttl: timedelta,
    dead_holder: str = "",
    recent: datetime | None = None,
) -> Taken:
    """Take the lease `name` for `holder` until `now + ttl` if it is free or has expired.

    One conditional UPDATE when the row exists and is free (every tick after the first); a
    read (and the INSERT that creates the row once) only when it is not taken.

    `dead_holder`: a holder the caller knows is gone (a process of this host that no longer
    exists); its lease is taken at once, still guarded by that exact holder being the one on
    the row. `recent`: a free lease last taken after this moment is not taken (`recent_at`
    says when it was): a periodic tick passes over a fleet another worker just ticked.
    """
    until = now + ttl
    row = _take(name, holder, now, until, dead_holder, recent)
    if row is None:
        current = _current(name, recent)
        if current is not None:
            return current
        try:
            with transaction.atomic():
                Lease.objects.create(name=name, holder=holder, expires_at=until, acquired_at=now)
            return Taken(True, until)
        except IntegrityError:
            # Created by another taker between our UPDATE and our INSERT: the conditional
            # UPDATE decides against the row as it is now.
            row = _take(name, holder, now, until, dead_holder, recent)
            if row is None:
                return _current(name, recent) or Taken(False, None)
    previous_holder: str = row[0] or ""
    previous_expires = _as_datetime(row[1])
    previous = {
        "holder": previous_holder,
        "expires_at": previous_expires,
        "acquired_at": _as_datetime(row[2]),
    }
    stale_holder = ""
    if previous_holder:
        expired = previous_expires is not None and previous_expires < now
        if expired or previous_holder == dead_holder:
            stale_holder = previous_holder
    if stale_holder:
        log.warning(
            "lease %s: taken over from %s (%s)",
            name,
            stale_holder,
            "gone" if stale_holder == dead_holder else "expired",
        )
    held = _last_held(previous, ttl)
    return Taken(True, until, stale_holder, last_held_at=held and min(held, now), sightings=row[3])


def _current(name: str, recent: datetime | None) -> Taken | None:
    """Why a take found nothing to take: the row's holder and deadline (None: no row)."""
    row = Lease.objects.filter(name=name).values("holder", "expires_at", "acquired_at").first()
    if row is None:
        return None
    taken_at = row["acquired_at"]
    if not row["holder"] and recent is not None and taken_at is not None and taken_at > recent:
        return Taken(False, row["expires_at"], recent_at=taken_at)
    return Taken(False, row["expires_at"], holder=row["holder"])


def lease_renew(*, name: str, holder: str, now: datetime, ttl: timedelta) -> datetime | None:
    """Extend `holder`'s lease to `now + ttl`; None if it is no longer theirs.

    Guarded by the holder only: a lease that ran out but that nobody took is still ours to
    extend, because nobody acted in between. One that was taken over stays lost.
    """
    until = now + ttl
    moved = Lease.objects.filter(name=name, holder=holder).update(expires_at=until)
    return until if moved else None


def lease_release(
    *,
    name: str,
    holder: str,
    now: datetime | None = None,
    sightings: dict[str, Any] | None = None,
) -> bool:
    """Give the lease back at once (only if `holder` still has it).

    `now`: the moment it is given back, kept as its expiry (a free lease either way) so the
    next taker knows when it was last held (`Taken.last_held_at`). `sightings`: the JSON to
    keep as the row's sightings (`fleets.reads.sightings`), in the same statement; None keeps
    them as they are.
    """
    table = connection.ops.quote_name(Lease._meta.db_table)
    adapt = connection.ops.adapt_datetimefield_value
    # Every tick ends here: a plain statement, not a queryset compiled each time.
    if sightings is None:
        sql = f"UPDATE {table} SET holder = '', expires_at = %s WHERE name = %s AND holder = %s"  # noqa: S608 - the name from the model, values bound
        params: list[Any] = [adapt(now), name, holder]
    else:
        sql = (
            f"UPDATE {table} SET holder = '', expires_at = %s, sightings = %s "  # noqa: S608 - the name from the model, values bound
            "WHERE name = %s AND holder = %s"
        )
        field = Lease._meta.get_field("sightings")
        params = [adapt(now), field.get_db_prep_value(sightings, connection), name, holder]
    with prepared.cursor() as cursor:
        cursor.execute(sql, params)
        return bool(cursor.rowcount > 0)
