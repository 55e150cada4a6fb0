"""Heartbeat writes: mirror what a supervisor reported onto slots and domains.

A heartbeat is read over HTTP before any of these run, so by the time it is applied an
operation step may already have moved the same rows. Every mirror is therefore a conditional
UPDATE guarded by the state we read AND by `state_updated_at <= observed_at`: a row changed
after the report was taken is newer than the report, and the report must not overwrite it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from fleets import clock
from fleets.core.states import check_transition
from fleets.models import Domain, Slot
from fleets.services.events import event_record


def slot_mirror(
    *,
    slot_id,
    from_state: str,
    to_state: str,
    observed_at: datetime,
    now: datetime,
    pids: list[int] | None = None,
    reason: str = "",
    actor: str = "heartbeat",
) -> bool:
    """Move a slot to the posture its supervisor reported; return whether it moved."""
    row = Slot.objects.filter(pk=slot_id).values("kind", "domain_id", "domain__fleet_id").first()
    if row is None or from_state == to_state:
        return False
    check_transition(row["kind"], from_state, to_state)
    extra: dict[str, Any] = {} if pids is None else {"pids": pids}
    with transaction.atomic():
        # Guarded by the state we read and by "unchanged since the report was taken".
        moved = Slot.objects.filter(
            pk=slot_id, state=from_state, state_updated_at__lte=observed_at
        ).update(state=to_state, state_updated_at=now, **extra)
        if moved:
            event_record(
                fleet_id=row["domain__fleet_id"],
                domain_id=row["domain_id"],
                kind=f"slot.{row['kind']}.{to_state}",
                actor=actor,
                data={"slotId": str(slot_id), "from": from_state, "to": to_state, "reason": reason},
            )
    return bool(moved)


def slot_pids_record(*, slot_id, pids: list[int]) -> None:
    """Remember the PIDs a supervisor reported for a training slot (display only, no state)."""
    Slot.objects.filter(pk=slot_id).exclude(pids=pids).update(pids=pids)


def domain_mirror(
    *,
    domain_id,
    from_state: str,
    to_state: str,
    observed_at: datetime,
    now: datetime,
    reason: str = "",
    actor: str = "heartbeat",
) -> bool:
    """Move a domain to the state its heartbeat implies; return whether it moved."""
    row = Domain.objects.filter(pk=domain_id).values("fleet_id").first()
    if row is None or from_state == to_state:
        return False
    check_transition("domain", from_state, to_state)
    with transaction.atomic():
        # Same guard as slots: escalation or a step that moved the domain after the report
        # was read wins over the report.
        moved = Domain.objects.filter(
            pk=domain_id, state=from_state, state_updated_at__lte=observed_at
        ).update(state=to_state, state_updated_at=now)
        if moved:
            event_record(
                fleet_id=row["fleet_id"],
                domain_id=domain_id,
                kind=f"domain.{to_state}",
                actor=actor,
                data={"from": from_state, "to": to_state, "reason": reason},
            )
    return bool(moved)


def domain_seen(
    *,
    domain_id,
    fleet_id,
    seen_at: datetime,
    report: dict[str, Any],
    previous_report: dict[str, Any] | None = None,
    actor: str = "heartbeat",
) -> bool:
    """Record a successful heartbeat: `last_seen_at` and the report, never moving time back.

    Writes `domain.heartbeat.recovered` when the previous heartbeat had failed.
    """
    previous = (previous_report or {}).get("heartbeat")
    was_failing = isinstance(previous, dict) and previous.get("ok") is False
    stamped = {
        **report,
        "heartbeat": {"ok": True, "checkedAt": clock.iso(seen_at)},
    }
    with transaction.atomic():
        # A slow tick finishing after a faster one must not make a live domain look staler.
        moved = (
            Domain.objects.filter(pk=domain_id)
            .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=seen_at))
            .update(last_seen_at=seen_at, last_report=stamped)
        )
        if moved and was_failing:
            event_record(
                fleet_id=fleet_id,
                domain_id=domain_id,
                kind="domain.heartbeat.recovered",
                actor=actor,
                data={"failingSince": previous.get("failingSince")},
            )
    return bool(moved)


def domain_heartbeat_failed(
    *,
    domain_id,
    fleet_id,
    checked_at: datetime,
    error: dict[str, Any],
    previous_report: dict[str, Any],
    actor: str = "heartbeat",
) -> bool:
    """Record a failed heartbeat on the report; write an event only when it starts failing.

    Edge-triggered on purpose: a dead host would otherwise add an event every tick.
    """
    previous = previous_report.get("heartbeat") if isinstance(previous_report, dict) else None
    was_failing = isinstance(previous, dict) and previous.get("ok") is False
    report = {
        **(previous_report if isinstance(previous_report, dict) else {}),
        "heartbeat": {
            "ok": False,
            "checkedAt": clock.iso(checked_at),
            "error": error,
            "failingSince": (previous or {}).get("failingSince") if was_failing else None,
        },
    }
    if not was_failing:
        report["heartbeat"]["failingSince"] = report["heartbeat"]["checkedAt"]
    with transaction.atomic():
        Domain.objects.filter(pk=domain_id).update(last_report=report)
        if not was_failing:
            event_record(
                fleet_id=fleet_id,
                domain_id=domain_id,
                kind="domain.heartbeat.failed",
                actor=actor,
                data=error,
            )
    return not was_failing
