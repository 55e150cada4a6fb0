"""Flap damping: an active that keeps coming back and failing is not failed over each time.

Pure: the caller passes the commit times of the fleet's recent automatic failovers and the
clock. A host that crashes, restarts and crashes again would otherwise get a failover per
crash, each stopping a trainer on one host, waking the other and restarting training where it
came from. Once a fleet had `flapMaxFailovers` automatic failovers within `flapWindowMs` it is
damped: a further failover needs the active lost for `flapHoldDownMs` (doubling with every
failover past the threshold, capped at the window), not just confirmed lost. The proxy holds
requests meanwhile, and a host that comes back in place within that time serves them itself.
The damping ends once enough failovers have aged out of the window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from fleets.core.policy import Policy

# 2**20 times any hold-down is past any window the policy accepts.
_MAX_DOUBLINGS = 20


@dataclass(frozen=True)
class Damping:
    """The fleet is damped: `failovers` automatic failovers in the window, the last at
    `last_at`; until `until`, a failover needs the active lost for `confirm_ms`."""

    failovers: int
    last_at: datetime
    until: datetime
    confirm_ms: int


def hold_down_ms(failovers: int, policy: Policy) -> int:
    """How long the active must be lost before a damped fleet fails over again."""
    extra = min(max(0, failovers - policy.flap_max_failovers), _MAX_DOUBLINGS)
    held: int = policy.flap_hold_down_ms << extra
    return min(held, policy.flap_window_ms)


def flap_damping(committed: Iterable[datetime], policy: Policy, now: datetime) -> Damping | None:
    """Return the fleet's damping from its automatic failovers' routing commits, or None.

    Counted: those within `flapWindowMs` before `now` (a commit stamped after `now`, from a
    clock ahead of this one, counts as now). Damped while at least `flapMaxFailovers` of them
    are in the window; `until` is when the oldest one that keeps it so ages out.
    """
    if policy.flap_max_failovers <= 0:
        return None  # damping switched off
    window = timedelta(milliseconds=policy.flap_window_ms)
    recent = sorted(min(at, now) for at in committed if now - at <= window)
    if len(recent) < policy.flap_max_failovers:
        return None
    # Dropping below the threshold needs len - max + 1 of them gone: the oldest that keeps it.
    keeps_it = recent[len(recent) - policy.flap_max_failovers]
    return Damping(
        failovers=len(recent),
        last_at=recent[-1],
        until=keeps_it + window,
        confirm_ms=hold_down_ms(len(recent), policy),
    )


def damped_hold(damping: Damping | None, lost_since: datetime | None, now: datetime) -> bool:
    """Whether a failover that the rules call for waits for the damping's confirmation.

    `lost_since`: when the active was last seen able to serve (its outage's start); None, never
    seen, counts as lost from now. A damped fleet fails over only once the active has been lost
    for the whole `confirm_ms`.
    """
    if damping is None:
        return False
    since = now if lost_since is None else min(lost_since, now)
    return now - since < timedelta(milliseconds=damping.confirm_ms)
