"""A fleet's health at a glance: green, amber or red, with the reasons.

One verdict, shown the same on the overview, the fleet page, the API's fleet list and its
filter, so it lives below all of them (the dashboard renders it, the API filters on it).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from fleets.core.failover import escalation_held, is_stale, is_viable_standby
from fleets.core.flapping import Damping
from fleets.core.policy import Policy
from fleets.core.read_model import FleetView
from fleets.core.report import DomainReport, read_report
from fleets.core.states import DomainState


def age_s(then: datetime | None, now: datetime) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def fmt_age(seconds: float | None) -> str:
    """Render an age compactly: 4.2s, 3m 10s, 2h 05m, 3d 4h."""
    if seconds is None:
        return "never"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def fleet_health(
    view: FleetView,
    now: datetime,
    heartbeat_errors: dict[str, str] | None = None,
    damping: Damping | None = None,
) -> tuple[str, list[str]]:
    """Return ("ok" | "warn" | "bad", reasons) for the fleet at a glance.

    `heartbeat_errors` maps domain id to the error of its failing heartbeat, if any; `damping`
    is the fleet's flap damping (fleets.core.flapping), if it is damped.
    """
    reasons: list[str] = []
    active = view.active
    level = "ok"
    if active is None:
        return "bad", ["no active domain: nothing serves traffic"]
    failing = (heartbeat_errors or {}).get(active.id)
    if damping is not None:
        level = "warn"
        reasons.append(damping_text(damping, view.policy, now))
    if active.state in (DomainState.FAILED, DomainState.STOPPING, DomainState.STOPPED):
        level = "bad"
        reasons.append(f"active {active.slug} is {active.state}")
    elif escalation_held(view, now):
        # Traffic is served: a warning, not an outage; but nothing moves through that host.
        level = "warn" if level == "ok" else level
        why = f" ({failing})" if failing else ""
        reasons.append(
            f"active {active.slug} degraded: supervisor unreachable, data path serving{why}; "
            "not failed over while its model servers serve"
        )
    elif failing:
        level = "bad"
        reasons.append(f"active {active.slug}: heartbeat failing ({failing})")
    elif is_stale(active, view.policy, now):
        level = "bad"
        reasons.append(f"active {active.slug}: heartbeat stale")
    elif active.last_seen_at is None:
        level = "warn"
        reasons.append(f"active {active.slug}: no heartbeat yet")
    elif active.state == DomainState.DEGRADED:
        level = "warn"
        reasons.append(f"active {active.slug} is degraded")
    if not view.standbys:
        reasons.append("no standby domain")
        level = "warn" if level == "ok" else level
    elif not any(is_viable_standby(d, view.policy, now) for d in view.standbys):
        reasons.append("no viable standby for failover")
        level = "warn" if level == "ok" else level
    return level, reasons


def damping_text(damping: Damping, policy: Policy, now: datetime) -> str:
    """One line for a fleet whose failovers are damped (fleets.core.flapping)."""
    window = fmt_age(policy.flap_window_ms / 1000)
    hold = fmt_age(damping.confirm_ms / 1000)
    until = fmt_age(age_s(now, damping.until))
    return (
        f"failovers damped: {damping.failovers} automatic failovers in the last {window}; "
        f"a failover waits for the active to stay lost {hold}; backing off until "
        f"{damping.until:%H:%M:%S} UTC (in {until})"
    )


def heartbeat_error(report: DomainReport) -> str | None:
    """The message of the domain's failing heartbeat; None when its last one answered."""
    note = report.heartbeat
    if note is None or note.ok:
        return None
    message = note.error.message if note.error is not None else ""
    return (message or "unreachable")[:120]


# The last report's heartbeat note, as a list reads it (`values_list` of the key, not the report).
HEARTBEAT_NOTE = "last_report__heartbeat"


def _stored_report(domain: Any) -> Any:
    """The domain's stored report, or as much of it as was read (the heartbeat's note)."""
    if hasattr(domain, HEARTBEAT_NOTE):
        return {"heartbeat": getattr(domain, HEARTBEAT_NOTE)}
    return domain.last_report


def heartbeat_errors(domains: Iterable[Any]) -> dict[str, str]:
    """Map domain id to the message of its failing heartbeat (domains whose last one failed).
    Domains are model instances or rows that read only the report's heartbeat note."""
    errors = {str(d.id): heartbeat_error(read_report(_stored_report(d))) for d in domains}
    return {domain_id: message for domain_id, message in errors.items() if message is not None}
