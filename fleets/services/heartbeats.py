"""Heartbeat writes: mirror what a supervisor reported onto slots and domains.

`heartbeat_record` writes one beat's plan (`fleets.core.beat_plan`) in one call; the functions
below it write one row each, with its event. A heartbeat is read over HTTP before any of these
run, so by the time it is applied an operation step may already have moved the same rows. Every
mirror is therefore a conditional UPDATE guarded by the state we read AND by
`state_updated_at <= observed_at`: a row changed after the report was taken is newer than the
report, and the report must not overwrite it. Each row is its own short transaction (no
supervisor call inside one, and no lock held across rows that operation steps also lock).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Case, F, Value, When

from fleets.base import clock
from fleets.core.beat_plan import BeatPlan
from fleets.core.report import HeartbeatNote, heartbeat_json, read_error, read_error_json
from fleets.models import Domain, Id, ModelBinding, Slot
from fleets.services.events import EventFields, guarded_update, not_newer
from fleets.services.model_health import model_health_record
from fleets.services.transitions import (
    SLOT_EVENT_FIELDS,
    domain_moved,
    slot_moved,
    state_move,
)

# `failing_since` not read by the caller: the service reads it.
UNREAD: Any = object()


def heartbeat_record(
    *,
    plan: BeatPlan,
    actor: str = "heartbeat",
    seen_before: datetime | None = None,
    failing_since: Any = UNREAD,
) -> None:
    """Write every move of one beat with its events: slots, the domain, each model server,
    then the domain row's record (seen or failed). A row whose guard fails (moved since it was
    read, or newer than the report) is left as it is and writes no event.

    `seen_before`: a good sighting of the domain that an earlier, unchanged beat did not record
    (`fleets.core.heartbeat_cadence`); a failure records it as `last_seen_at` (never moving it
    back), so the outage starts when the host was last heard. `failing_since`: the domain's
    `heartbeat_failing_since` as the caller read it (the record's guard; read here if not
    given)."""
    for move in plan.slots:
        slot_mirror(
            slot_id=move.slot_id,
            from_state=move.from_state,
            to_state=move.to_state,
            observed_at=plan.observed_at,
            now=plan.now,
            pids=move.pids,
            reason=move.reason,
            actor=actor,
        )
    for record in plan.pids:
        slot_pids_record(slot_id=record.slot_id, pids=record.pids)
    if plan.domain is not None:
        domain_mirror(
            domain_id=plan.domain_id,
            from_state=plan.domain.from_state,
            to_state=plan.domain.to_state,
            observed_at=plan.observed_at,
            now=plan.now,
            reason=plan.domain.reason,
        )
    for health in plan.health:
        model_health_record(
            binding_id=health.binding_id,
            health=health.health,
            observed_at=plan.observed_at,
            source=health.source,
            actor=actor,
        )
    for version in plan.versions:
        binding_engine_version_record(
            binding_id=version.binding_id,
            engine_version=version.engine_version,
            observed_at=plan.observed_at,
            actor=actor,
        )
    if plan.seen is not None:
        domain_seen(
            domain_id=plan.domain_id,
            fleet_id=plan.fleet_id,
            seen_at=plan.observed_at,
            report=plan.seen.to_json(),
            gpus_read_at=plan.gpus_read_at,
            failing_since=failing_since,
        )
    elif plan.failed is not None:
        domain_heartbeat_failed(
            domain_id=plan.domain_id,
            fleet_id=plan.fleet_id,
            checked_at=plan.observed_at,
            error=read_error_json(plan.failed),
            seen_before=seen_before,
        )


def slot_mirror(
    *,
    slot_id: Id,
    from_state: str,
    to_state: str,
    observed_at: datetime,
    now: datetime,
    pids: list[int] | None = None,
    reason: str = "",
    actor: str = "heartbeat",
) -> bool:
    """Move a slot to the posture its supervisor reported; return whether it moved."""
    row = Slot.objects.filter(pk=slot_id).values(*SLOT_EVENT_FIELDS).first()
    if row is None or from_state == to_state:
        return False
    # Guarded by the state we read and by "unchanged since the report was taken".
    return state_move(
        Slot.objects.filter(pk=slot_id, state_updated_at__lte=observed_at),
        row["kind"],
        from_state,
        to_state,
        slot_moved(row, slot_id, from_state, to_state, actor, reason),
        now=now,
        extra=None if pids is None else {"pids": pids},
    )


def slot_pids_record(*, slot_id: Id, pids: list[int]) -> None:
    """Remember the PIDs a supervisor reported for a training slot (display only, no state)."""
    Slot.objects.filter(pk=slot_id).exclude(pids=pids).update(pids=pids)


def domain_mirror(
    *,
    domain_id: Id,
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
    # Same guard as slots: escalation or a step that moved the domain after the report was
    # read wins over the report.
    return state_move(
        Domain.objects.filter(pk=domain_id, state_updated_at__lte=observed_at),
        "domain",
        from_state,
        to_state,
        domain_moved(row["fleet_id"], domain_id, from_state, to_state, actor, reason),
        now=now,
    )


def domain_seen(
    *,
    domain_id: Id,
    fleet_id: Id,
    seen_at: datetime,
    report: dict[str, Any],
    gpus_read_at: datetime | None = None,
    actor: str = "heartbeat",
    failing_since: Any = UNREAD,
) -> bool:
    """Record a successful heartbeat: `last_seen_at`, the report, and (when this beat stored a
    GPU memory answer) `gpus_read_at`, never moving time back; return whether it was recorded.

    Writes `domain.heartbeat.recovered` when the heartbeat had been failing. Guarded by the
    failing-since value read (a concurrent failure record makes this one lose, not mix) and by
    the last recorded heartbeat, good or bad: a success observed before it writes nothing.
    `failing_since`: that value as the caller read it (the tick's snapshot), saving the read.
    """
    if failing_since is UNREAD:
        failing_since = (
            Domain.objects.filter(pk=domain_id)
            .values_list("heartbeat_failing_since", flat=True)
            .first()
        )
    stamped = {
        **report,
        "heartbeat": heartbeat_json(HeartbeatNote(ok=True, checked_at=seen_at)),
    }
    values: dict[str, Any] = {
        "last_seen_at": seen_at,
        "last_report": stamped,
        "heartbeat_checked_at": seen_at,
        "heartbeat_failing_since": None,
    }
    if gpus_read_at is not None:
        # Another process's reads keep their own in-flight table, so a newer beat may carry an
        # answer asked before the one already stored: keep the later time.
        values["gpus_read_at"] = Case(
            When(not_newer("gpus_read_at", gpus_read_at), then=Value(gpus_read_at)),
            default=F("gpus_read_at"),
        )
    recovered: list[EventFields] = []
    if failing_since is not None:
        recovered.append(
            {
                "fleet_id": fleet_id,
                "domain_id": domain_id,
                "kind": "domain.heartbeat.recovered",
                "actor": actor,
                "data": {"failingSince": clock.iso(failing_since)},
            }
        )
    # Guarded like a failure: by the failing-since value read (the recovered edge is decided
    # once) and by "not older than any heartbeat recorded so far", good or bad. A success a
    # slow tick observed before a faster tick's failure is older news: recording it would
    # clear the failure, move `heartbeat_checked_at` back and report a recovery that did not
    # happen. A success and a failure taken at the same instant: the success wins (the
    # failure's guard is strict on `last_seen_at`).
    guard = (
        Domain.objects.filter(pk=domain_id, heartbeat_failing_since=failing_since)
        .filter(not_newer("heartbeat_checked_at", seen_at, tie_wins=True))
        .filter(not_newer("last_seen_at", seen_at))
    )
    if not recovered:
        # No event to write with it: the one UPDATE is its own transaction.
        return bool(guard.update(**values))
    return bool(guarded_update(guard, values, *recovered))


def domain_heartbeat_failed(
    *,
    domain_id: Id,
    fleet_id: Id,
    checked_at: datetime,
    error: dict[str, Any],
    actor: str = "heartbeat",
    seen_before: datetime | None = None,
) -> bool:
    """Record a failed heartbeat; return whether it started failing with this one.

    `seen_before`: the last good sighting not recorded yet (earlier than `checked_at`); it
    becomes `last_seen_at` unless that is already as late.

    Edge-triggered on purpose: only the first failure writes `domain.heartbeat.failed` (a dead
    host would otherwise add an event every tick). Guarded like `domain_seen`: a failure taken
    before the last recorded heartbeat (good or bad) is older news and writes nothing.
    """
    row = (
        Domain.objects.filter(pk=domain_id).values("heartbeat_failing_since", "last_report").first()
    )
    if row is None:
        return False
    failing_since = row["heartbeat_failing_since"]
    started = failing_since is None
    since = checked_at if started else failing_since
    shown = row["last_report"] if isinstance(row["last_report"], dict) else {}
    report = {
        **shown,
        "heartbeat": heartbeat_json(
            HeartbeatNote(
                ok=False, checked_at=checked_at, failing_since=since, error=read_error(error)
            )
        ),
    }
    failed: EventFields = {
        "fleet_id": fleet_id,
        "domain_id": domain_id,
        "kind": "domain.heartbeat.failed",
        "actor": actor,
        "data": error,
    }
    values: dict[str, Any] = {
        "heartbeat_checked_at": checked_at,
        "heartbeat_failing_since": since,
        "last_report": report,
    }
    if seen_before is not None and seen_before < checked_at:
        # Never back: another process may have recorded a later sighting meanwhile.
        values["last_seen_at"] = Case(
            When(not_newer("last_seen_at", seen_before), then=Value(seen_before)),
            default=F("last_seen_at"),
        )
    # Guarded by the failing-since value read (so the edge is decided once) and by "newer than
    # every heartbeat recorded so far".
    moved = guarded_update(
        Domain.objects.filter(pk=domain_id, heartbeat_failing_since=failing_since)
        .filter(not_newer("heartbeat_checked_at", checked_at))
        .filter(not_newer("last_seen_at", checked_at)),
        values,
        *([failed] if started else []),
    )
    return bool(moved) and started


def binding_engine_version_record(
    *, binding_id: Id, engine_version: str, observed_at: datetime, actor: str = "heartbeat"
) -> bool:
    """Remember the engine version a binding's server reported; return whether it changed.

    Golden baselines are kept per engine version, so the baseline pass and the readiness
    verdict read this column to see an upgrade before any wake. Written only on a change, and
    guarded like the other heartbeat columns: by the version read (so the change event is
    written once) and by "newer than the version recorded" (a slower beat with older news
    loses). `engine_version_at` is when the current version was first reported.
    """
    row = (
        ModelBinding.objects.filter(pk=binding_id)
        .values("engine_version", "name", "domain_id", "domain__fleet_id")
        .first()
    )
    if row is None or not engine_version or row["engine_version"] == engine_version:
        return False
    moved = guarded_update(
        ModelBinding.objects.filter(pk=binding_id, engine_version=row["engine_version"]).filter(
            not_newer("engine_version_at", observed_at)
        ),
        {"engine_version": engine_version, "engine_version_at": observed_at},
        {
            "fleet_id": row["domain__fleet_id"],
            "domain_id": row["domain_id"],
            "kind": "model.engine_version.changed",
            "actor": actor,
            "data": {
                "model": row["name"],
                "from": row["engine_version"] or None,
                "to": engine_version,
                "observedAt": clock.iso(observed_at),
            },
        },
    )
    return bool(moved)
