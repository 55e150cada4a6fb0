"""One tick per fleet at a time, across threads, processes and machines: a lease with a deadline.

The tick takes the row `tick:<fleet id>` (`fleets.services.leases`) by a conditional UPDATE and
renews it at checkpoints while it runs (`TickLease.check`, called between heartbeats, decisions
and every operation step). A holder that freezes (SIGSTOP, a stuck VM, a swapped-out process)
or dies stops renewing, so another worker takes the fleet over once the lease runs out: a frozen
process delays a fleet by at most one lease (`HARU_TICK_LEASE_MS`, default 15 s: a few seconds
more than the longest stretch a tick spends between checkpoints, one supervisor call capped at
10 s). Nothing lives on a database session, so it works behind a transaction-mode pooler.

A holder that was a process of this host and no longer exists (SIGKILL, Celery's hard time
limit) is taken over at once: the holder id names the host, PID namespace and PID.

Fail closed: a holder whose renewal finds the lease taken over, or that could not confirm it
within its length, raises `LeaseLost` at the next checkpoint and writes nothing more. The lease
only avoids duplicate supervisor calls and wasted work; correctness never depends on it, because
every state change is a conditional UPDATE (a write from a holder that lost its lease between a
checkpoint and the write is refused by the same guards that order two concurrent ticks).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

from django.db import DatabaseError, connection

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.core.dispatch import PERIODIC_SKIP_SHARE
from fleets.models import Id
from fleets.reads import sightings as sightings_mod
from fleets.reads.sightings import tick_lease_name  # one name for the writer and the readers
from fleets.reconciler.supervisor.transport import CALL_CAP_S
from fleets.services.leases import lease_acquire, lease_release, lease_renew

_POLL_S = 0.05
# Renew once a third of the lease has gone by: two renewals can be missed before it runs out.
_RENEW_FRACTION = 1 / 3


class LeaseLost(Exception):
    """The lease was taken over (or could not be confirmed in time): stop, write nothing more."""


def tick_lease_s() -> float:
    return float(haru_settings().tick_lease_ms) / 1000


# A tick takes its lease for this share of its length, and for the whole length from the moment
# it leaves the quiet path (`TickLease.widen`): an idle tick's longest stretch between two
# checkpoints is one heartbeat round (at most half a supervisor call's cap), so a worker that
# dies in one hands the fleet over in half a lease; a tick that calls supervisors for longer
# (an operation's steps, up to CALL_CAP_S a call) holds the whole lease, renewed as before.
QUIET_LEASE_SHARE = 0.5
# Never shorter than the quiet path's longest call (CALL_CAP_S / 2) and a second.
QUIET_LEASE_MIN_S = CALL_CAP_S / 2 + 1


def quiet_lease_for(whole_s: float) -> float:
    """How long a tick's lease of `whole_s` lasts until the tick leaves the quiet path."""
    return min(whole_s, max(whole_s * QUIET_LEASE_SHARE, QUIET_LEASE_MIN_S))


def quiet_lease_s() -> float:
    """`quiet_lease_for` this process's tick lease (HARU_TICK_LEASE_MS)."""
    return quiet_lease_for(tick_lease_s())


def _pid_namespace() -> str:
    """This process's PID namespace (containers sharing a host name do not share it)."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return "-"


_HOST = f"{socket.gethostname()[:48]}:{_pid_namespace()[:16]}"


def _holder_id() -> str:
    # Unique per acquisition (two threads of one process exclude each other as two processes
    # do); host, PID namespace and PID make the row readable and let a process on the same host
    # see that the holder is gone (`local_and_dead`).
    return f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def local_and_dead(holder: str) -> bool:
    """Whether `holder` was a process of this host (and PID namespace) that no longer exists.

    A worker killed with SIGKILL (or by Celery's hard time limit) is then taken over at once
    instead of one lease later. A reused PID only makes us wait for the deadline, as for a
    holder on another host.
    """
    parts = holder.rsplit(":", 2)  # host:pidns, pid, nonce
    if len(parts) != 3 or parts[0] != _HOST or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists (EPERM: another user's process)
        return False
    # Killed but not yet reaped by its parent (a Celery pool process just SIGKILLed): a zombie
    # runs no code and holds nothing.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


class TickLease:
    """A lease this process took (or tried to take). Truthy when held.

    `periodic_s`: the take is a periodic tick's, at that interval: a lease another tick took
    less than `PERIODIC_SKIP_SHARE` of it ago is not taken, and `retry_in_s` says when that
    tick's next one is due (fleets/core/dispatch.py). `first_ttl_s`: taken for that long, and
    for `ttl_s` from the first renewal or `widen` on."""

    def __init__(
        self,
        name: str,
        ttl_s: float,
        periodic_s: float | None = None,
        first_ttl_s: float | None = None,
    ) -> None:
        self.name = name
        self.ttl_s = ttl_s
        self.periodic_s = periodic_s
        # What the row's deadline was last set for: the first length until a renewal.
        self._held_ttl_s = min(ttl_s, first_ttl_s) if first_ttl_s is not None else ttl_s
        self.holder = _holder_id()
        self.acquired = False
        self.taken_over_from = ""
        self.retry_in_s: float | None = None  # not acquired: when the holder's lease runs out
        # Acquired: when a holder before this one last held it (None: never, as far as known).
        self.last_held_at: datetime | None = None
        # When the last take/renew was *sent*, on the injectable clock's monotonic reading (a
        # test's fake clock moving past the lease is a frozen holder).
        self._confirmed_mono = 0.0
        self._lost = False
        # Acquired: the heartbeat sightings on the row (`fleets.reads.sightings`); written back
        # with the give-back once handed to a tick (`sightings_for_tick`).
        self._sightings: sightings_mod.Sightings = {}
        self._keep_sightings = False

    def __bool__(self) -> bool:
        return self.acquired

    def _ttl(self) -> timedelta:
        return timedelta(seconds=self.ttl_s)

    def _held_ttl(self) -> timedelta:
        return timedelta(seconds=self._held_ttl_s)

    def try_take(self) -> bool:
        sent = clock.get_clock().monotonic()
        now = clock.now()
        recent = None
        if self.periodic_s is not None:
            recent = now - timedelta(seconds=self.periodic_s * PERIODIC_SKIP_SHARE)
        taken = lease_acquire(
            name=self.name, holder=self.holder, now=now, ttl=self._held_ttl(), recent=recent
        )
        if not taken.acquired and taken.holder and local_and_dead(taken.holder):
            taken = lease_acquire(
                name=self.name,
                holder=self.holder,
                now=now,
                ttl=self._held_ttl(),
                dead_holder=taken.holder,
            )
        self.acquired = taken.acquired
        if taken.acquired:
            self._confirmed_mono = sent
            self.taken_over_from = taken.taken_over_from
            self.retry_in_s = None
            self.last_held_at = taken.last_held_at
            self._sightings = sightings_mod.decode(taken.sightings)
        elif taken.recent_at is not None and self.periodic_s is not None:
            due = taken.recent_at + timedelta(seconds=self.periodic_s)
            self.retry_in_s = max(0.0, (due - now).total_seconds())
        elif taken.expires_at is not None:
            self.retry_in_s = max(0.0, (taken.expires_at - now).total_seconds())
        return self.acquired

    def held(self) -> bool:
        """Whether this holder may still act, as far as it can tell without asking."""
        return (
            self.acquired
            and not self._lost
            and clock.get_clock().monotonic() < self._confirmed_mono + self._held_ttl_s
        )

    def check(self) -> None:
        """A checkpoint: renew when a third of the lease has gone; raise LeaseLost if it is gone.

        A database error while renewing propagates (the tick fails, nothing more is written); a
        renewal that finds another holder, or a checkpoint reached after the lease's own length
        without a confirmed renewal, raises LeaseLost.
        """
        if not self.acquired or self._lost:
            raise LeaseLost(self.name)
        elapsed = clock.get_clock().monotonic() - self._confirmed_mono
        if elapsed < self._held_ttl_s * _RENEW_FRACTION:
            return
        self._renew()

    def widen(self) -> None:
        """Hold the lease for its whole length from now on (the tick leaves the quiet path:
        longer calls may follow); raise LeaseLost as `check` does. Nothing to do when it
        already is."""
        if not self.acquired or self._lost:
            raise LeaseLost(self.name)
        if self._held_ttl_s < self.ttl_s:
            self._renew()

    def _renew(self) -> None:
        sent = clock.get_clock().monotonic()
        renewed = lease_renew(name=self.name, holder=self.holder, now=clock.now(), ttl=self._ttl())
        if renewed is None:
            self._lost = True
            raise LeaseLost(f"{self.name}: taken over by another holder")
        self._confirmed_mono = sent
        self._held_ttl_s = self.ttl_s

    def sightings_for_tick(self) -> sightings_mod.Sightings:
        """The sightings the row held when taken, for the tick to read and add to: what it
        holds when the lease is given back is written with the give-back."""
        self._keep_sightings = True
        return self._sightings

    def release(self) -> None:
        if self.acquired and not self._lost:
            kept = sightings_mod.encode(self._sightings) if self._keep_sightings else None
            try:
                lease_release(name=self.name, holder=self.holder, now=clock.now(), sightings=kept)
            except DatabaseError:
                # The tick most likely failed on the same broken connection (a database restart):
                # one retry on a fresh connection gives the fleet back now instead of one lease
                # later. Still unreachable: the lease simply runs out.
                if not connection.in_atomic_block:
                    with contextlib.suppress(Exception):
                        connection.close()
                        lease_release(
                            name=self.name, holder=self.holder, now=clock.now(), sightings=kept
                        )
        self.acquired = False


@contextlib.contextmanager
def lease_held(
    name: str,
    *,
    wait_s: float = 0.0,
    ttl_s: float | None = None,
    periodic_s: float | None = None,
    first_ttl_s: float | None = None,
) -> Iterator[TickLease]:
    """Hold the lease `name` for the block; yields the lease, truthy if taken within `wait_s`
    (`periodic_s`, `first_ttl_s`: see `TickLease`)."""
    lease = TickLease(name, tick_lease_s() if ttl_s is None else ttl_s, periodic_s, first_ttl_s)
    deadline = time.monotonic() + wait_s
    while not lease.try_take() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    try:
        yield lease
    finally:
        lease.release()


def fleet_tick_lock(
    fleet_id: Id, *, wait_s: float = 0.0, periodic_s: float | None = None
) -> contextlib.AbstractContextManager[TickLease]:
    """Hold the fleet's tick lease; yields the lease, truthy if it was taken within `wait_s`
    (`periodic_s`: see `TickLease`). Taken for `quiet_lease_s` until the tick widens it."""
    return lease_held(
        tick_lease_name(fleet_id),
        wait_s=wait_s,
        periodic_s=periodic_s,
        first_ttl_s=quiet_lease_s(),
    )
