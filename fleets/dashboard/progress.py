"""An operation's progress as the fleet page shows it: every step of its plan (the one list in
`fleets.core.states`), each with its status and time, read from the operation's step events.

The in-flight panel and the drill panel both render this, so they cannot count steps
differently."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from fleets.base.clock import iso
from fleets.core.preemption import Ending, InFlight, ending
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, OperationState, steps_for
from fleets.dashboard.chart import fmt_ms
from fleets.models import Event, Operation
from fleets.reads.continued_streams import operation_streams_continued
from fleets.reads.recovery import operation_failover_ms

RETRY_EVENT = "operation.step.retry"


def _elapsed_ms(then: datetime, now: datetime) -> int:
    return int(max(0.0, (now - then).total_seconds()) * 1000)


def _step_entries(op: Operation, step_events: list[Event], now: datetime) -> list[dict[str, Any]]:
    """Each step of the operation's plan, with its status, elapsed time and detail."""
    done: dict[str, Event] = {}
    retries: dict[str, Event] = {}
    for e in step_events:
        if e.kind == RETRY_EVENT:
            retries[e.step] = e  # the newest attempt (events come oldest first)
        elif e.step and e.kind.startswith("operation.step.") and e.step not in done:
            done[e.step] = e
    error = op.error if isinstance(op.error, dict) else None
    running = op.state in IN_FLIGHT_OPERATION_STATES
    steps = []
    for name in steps_for(op.kind, op.drill_mode):
        entry: dict[str, Any] = {"name": name, "ms": None, "since": None, "detail": ""}
        if name in done:
            event = done[name]
            entry["status"] = "done" if event.kind == "operation.step.done" else "warn"
            if entry["status"] == "warn":
                entry["detail"] = event.kind.removeprefix("operation.step.").replace("_", " ")
            entry["ms"] = event.duration_ms
        elif running and op.state == OperationState.RUNNING and name == op.current_step:
            entry["status"] = "running"
            entry["since"] = iso(op.step_started_at)
            entry["ms"] = _elapsed_ms(op.step_started_at, now) if op.step_started_at else None
            retry = retries.get(name)
            if retry is not None:
                data = retry.data if isinstance(retry.data, dict) else {}
                entry["detail"] = f"retry {data.get('attempt', '?')}: {data.get('message', '')}"
        elif error and error.get("step") == name:
            entry["status"] = "failed"
            entry["detail"] = f"{error.get('code', '')}: {error.get('message', '')}"
        elif op.state in (OperationState.FAILED, OperationState.CANCELLED):
            entry["status"] = "skipped"
        else:
            entry["status"] = "pending"
        entry["elapsed"] = fmt_ms(entry["ms"]) if entry["ms"] is not None else ""
        steps.append(entry)
    return steps


def operation_progress(
    op: Operation, step_events: list[Event], now: datetime, slugs: dict
) -> dict[str, Any]:
    """Return the step-by-step view of one operation: each step's status and elapsed time."""
    error = op.error if isinstance(op.error, dict) else None
    running = op.state in IN_FLIGHT_OPERATION_STATES
    steps = _step_entries(op, step_events, now)
    ending_of = ending(
        InFlight(
            kind=op.kind,
            target_id=None,
            routing_committed=op.routing_committed,
            current_step=op.current_step,
            drill_mode=op.drill_mode,
        )
    )
    end = op.finished_at or now
    start = op.started_at or op.created_at
    total_ms = _elapsed_ms(start, end) if start else None
    figure = operation_failover_ms(op)
    return {
        "id": str(op.id),
        "short_id": str(op.id)[:8],
        "kind": op.kind,
        "state": op.state,
        "in_flight": running,
        "reason": op.reason,
        "requested_by": op.requested_by,
        "target": slugs.get(op.target_domain_id, "?"),
        "source": slugs.get(op.source_domain_id, "") if op.source_domain_id else "",
        "current_step": op.current_step if running else "",
        "step_started_at": iso(op.step_started_at) if running else None,
        "created_at": iso(op.created_at),
        "started_at": iso(op.started_at),
        "finished_at": iso(op.finished_at),
        "routing_committed": op.routing_committed,
        # Clients are served by the target from the routing commit on, while the promotion
        # may still run its best-effort steps on the old active: the page says so.
        "served_at": iso(op.served_at),
        "served_time": op.served_at.strftime("%H:%M:%S") if op.served_at else "",
        "failover": fmt_ms(figure) if figure is not None else "",
        # The same count as the API's `streamsContinued` (fleets/reads/continued_streams.py).
        "streams_continued": operation_streams_continued(op),
        # Until routing moves a cancel ends the operation cancelled; after, it ends a
        # promotion succeeded without its best-effort steps (not in the instant between the
        # switch and its record, when the service asks to retry).
        "can_cancel": running and ending_of != Ending.NOT_YET,
        "cancel_skips_rest": running and ending_of == Ending.SKIP_REST,
        "cleanup": op.cleanup,
        "error": error,
        "steps": steps,
        "total": fmt_ms(total_ms) if total_ms is not None else "",
    }


def step_events(op_ids: list) -> dict[Any, list[Event]]:
    by_op: dict[Any, list[Event]] = defaultdict(list)
    if not op_ids:
        return by_op
    rows = (
        Event.objects.filter(operation_id__in=op_ids, kind__startswith="operation.step.")
        .only("operation_id", "kind", "step", "duration_ms", "data", "created_at")
        .order_by("id")
    )
    for e in rows:
        by_op[e.operation_id].append(e)
    return by_op
