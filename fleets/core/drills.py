"""Failover drills: when one may run, and when the schedule says one is due.

A drill has a mode (DrillMode). `check` proves a standby can take over without moving routing:
stop its training, verify its GPU memory, wake it, golden-probe it, put it back to sleep and
restart training (DRILL_STEPS). `round_trip` runs the promotion itself, to the standby and back
to the original active (ROUND_TRIP_DRILL_STEPS): routing moves twice, each by the one
compare-and-swap, and the demotion of each side is proven under real traffic. A round trip is
refused while automatic failover is off: an operator who turned it off said routing must not
move without them. No drill runs while anything is degraded or an operation is in flight: a
drill must never make a fleet worse than it found it, nor compete with a real failover for the
standby.

Pure: the caller supplies the clock and re-checks "nothing in flight" in the database.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta

from fleets.core.decisions import INVALID_TARGET, Decision, find_domain
from fleets.core.failover import is_viable_standby, rank_standbys
from fleets.core.read_model import FleetView
from fleets.core.states import DomainState, DrillMode

# The bounds of a schedule an operator sets in admin.
MIN_INTERVAL_MINUTES = 1
MAX_INTERVAL_MINUTES = 60 * 24 * 90


@dataclass(frozen=True)
class DrillSchedule:
    """Every `interval_minutes`, inside the daily UTC window [start, end) (wrapping midnight
    when end <= start); no interval: drills run only when asked for."""

    interval_minutes: int | None = None
    window_start: time | None = None
    window_end: time | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_minutes is not None


def schedule_problems(schedule: DrillSchedule) -> list[str]:
    """What is wrong with a schedule an operator wrote; empty when it is usable."""
    problems = []
    n = schedule.interval_minutes
    if n is not None and not MIN_INTERVAL_MINUTES <= n <= MAX_INTERVAL_MINUTES:
        problems.append(
            f"drill interval must be {MIN_INTERVAL_MINUTES} to {MAX_INTERVAL_MINUTES} minutes"
        )
    if (schedule.window_start is None) != (schedule.window_end is None):
        problems.append("give both ends of the drill window, or neither (any time of day)")
    if schedule.window_start is not None and schedule.window_start == schedule.window_end:
        problems.append("the drill window is empty (start equals end)")
    return problems


def in_window(schedule: DrillSchedule, now: datetime) -> bool:
    """Whether `now` (aware) falls in the schedule's daily UTC window (no window: always)."""
    start, end = schedule.window_start, schedule.window_end
    if start is None or end is None:
        return True
    t = now.astimezone(UTC).time()
    if start < end:
        return start <= t < end
    return t >= start or t < end  # the window wraps midnight


def drill_due(schedule: DrillSchedule, last_requested_at: datetime | None, now: datetime) -> bool:
    """Whether the schedule asks for a drill now, given when the last one was requested."""
    if not schedule.enabled or not in_window(schedule, now):
        return False
    assert schedule.interval_minutes is not None
    if last_requested_at is None:
        return True
    return now - last_requested_at >= timedelta(minutes=schedule.interval_minutes)


def decide_drill(
    fleet: FleetView, target_ref: str | None, now: datetime, mode: str = DrillMode.CHECK
) -> Decision:
    """Decide a drill request; `target_ref` None drills the standby a failover would take."""
    if mode == DrillMode.ROUND_TRIP and not fleet.policy.auto_failover:
        return Decision(
            "reject",
            INVALID_TARGET,
            "no round-trip drill while autoFailover is off: it moves routing twice; "
            "run a check drill, or turn autoFailover on",
        )
    troubled = [d for d in fleet.domains if d.state in (DomainState.DEGRADED, DomainState.FAILED)]
    if troubled:
        names = ", ".join(f"{d.slug} is {d.state}" for d in troubled)
        return Decision("reject", INVALID_TARGET, f"no drill while anything is degraded: {names}")
    active = fleet.active
    if active is None or active.state != DomainState.READY:
        return Decision("reject", INVALID_TARGET, "no drill without a ready active domain")
    if target_ref is None:
        ranked = rank_standbys(fleet, now)
        if not ranked:
            return Decision("reject", INVALID_TARGET, "the fleet has no standby to drill")
        target = ranked[0]
    else:
        found = find_domain(fleet, target_ref)
        if found is None:
            return Decision(
                "reject", INVALID_TARGET, f"domain {target_ref!r} is not in fleet {fleet.slug!r}"
            )
        target = found
    if target.id == fleet.active_domain_id:
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is the active domain; a drill checks a standby",
            target,
        )
    if not is_viable_standby(target, fleet.policy, now):
        return Decision(
            "reject",
            INVALID_TARGET,
            f"domain {target.slug!r} is not a viable standby now (state {target.state}, a "
            "fresh heartbeat, bindings and a supervisor are needed); the readiness verdict "
            "says why",
            target,
        )
    return replace(Decision("proceed"), target=target)
