"""Resume an in-flight operation's step clock after the control plane was away (see
`fleets.core.resume`), with the event that says so."""

from __future__ import annotations

from datetime import datetime, timedelta

from fleets.base import clock
from fleets.core.resume import away_for, resumed_step_start
from fleets.core.states import OperationState
from fleets.models import Id, Operation
from fleets.services.events import guarded_update


def operation_step_clock_resume(
    *,
    fleet_id: Id,
    last_held_at: datetime | None,
    now: datetime,
    away_after: timedelta,
    actor: str = "reconciler",
) -> int:
    """Move the running step's start of the fleet's operation past the control plane's absence;
    return the absence in ms (0: it was not away, or nothing was running).

    Guarded by the start it read, so two ticks resuming the same step move it once.
    """
    away = away_for(last_held_at, now, away_after)
    if last_held_at is None or not away:
        return 0
    op = (
        Operation.objects.filter(fleet_id=fleet_id, state=OperationState.RUNNING)
        .values("id", "current_step", "step_started_at")
        .first()
    )
    started = op["step_started_at"] if op is not None else None
    if op is None or started is None:
        return 0
    resumed = resumed_step_start(started, last_held_at, now)
    away_ms = int(away.total_seconds() * 1000)
    moved = guarded_update(
        Operation.objects.filter(
            pk=op["id"],
            state=OperationState.RUNNING,
            current_step=op["current_step"],
            step_started_at=started,
        ),
        {"step_started_at": resumed},
        {
            "fleet_id": fleet_id,
            "operation_id": op["id"],
            "kind": "operation.resumed",
            "actor": actor,
            "step": op["current_step"],
            "data": {
                "awayMs": away_ms,
                "lastHeldAt": clock.iso(last_held_at),
                "stepRanMs": int((now - resumed).total_seconds() * 1000),
            },
        },
    )
    return away_ms if moved else 0
