"""The fleet page's proof panels: can we fail over now, the last drill, the published recovery
time and the golden baselines. Each reads the same functions as the API and /metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleets.base.clock import iso
from fleets.core.golden import target_label
from fleets.core.policy import Policy
from fleets.core.read_model import FleetView
from fleets.core.recovery import RECOVERY_WINDOW, over_objective
from fleets.core.states import DrillMode, OperationKind, OperationState
from fleets.dashboard.chart import fmt_ms
from fleets.dashboard.progress import operation_progress, step_events
from fleets.models import Fleet, GoldenBaseline, Operation
from fleets.reads.readiness import fleet_readiness
from fleets.reads.recovery import recovery_summaries

# How many baselines the page lists (the API lists all).
BASELINE_ROWS = 12


def _age_text(ms: float | None) -> str:
    if ms is None:
        return ""
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d {int(seconds % 86400 // 3600)}h"


def readiness_panel(fleet: Fleet, view: FleetView, now: datetime) -> dict[str, Any]:
    r = fleet_readiness(fleet, view, now)
    reasons = []
    for reason in r.reasons:
        body = reason.to_json(now)
        # Accepted: unproven, and the fleet's policy says a failover need not wait for it.
        status = (
            "accepted"
            if reason.accepted
            else {True: "ok", False: "bad", None: "unknown"}[reason.ok]
        )
        reasons.append({**body, "status": status, "age": _age_text(body["ageMs"])})
    return {"verdict": r.verdict, "standby": r.standby, "reasons": reasons}


def drill_panel(fleet: Fleet, now: datetime) -> dict[str, Any] | None:
    """The newest drill, in flight or finished: its steps' times and how it ended."""
    op = Operation.objects.filter(fleet=fleet, kind=OperationKind.DRILL).first()
    if op is None:
        return None
    # Every step of the drill's plan with its status, as the operation panel shows it: the
    # panel listed only the `done` events, so a step that was skipped, timed out best-effort
    # or was still to come had no box.
    progress = operation_progress(op, step_events([op.id]).get(op.id, []), now, {})
    error = op.error if isinstance(op.error, dict) else None
    finished = op.finished_at
    return {
        "id": str(op.id),
        "state": op.state,
        "failed": op.state == OperationState.FAILED,
        "target": op.target_slug,
        "mode": op.drill_mode or DrillMode.CHECK,
        "reason": op.reason,
        "finished_at": iso(finished) if finished else "",
        "finished_age": _age_text((now - finished).total_seconds() * 1000) if finished else "",
        "steps": [
            {"name": s["name"], "status": s["status"], "time": s["elapsed"], "detail": s["detail"]}
            for s in progress["steps"]
        ],
        "error": error,
    }


def recovery_panel(fleet: Fleet) -> dict[str, Any]:
    rto = Policy.resolve(fleet.policy).rto_ms
    rows = []
    for kind, summary in recovery_summaries(fleet).items():
        rows.append(
            {
                "kind": kind,
                "count": summary.count,
                "p50": fmt_ms(summary.p50_ms),
                "p95": fmt_ms(summary.p95_ms),
                "over": over_objective(summary, rto),
            }
        )
    return {"rto": fmt_ms(rto), "window": RECOVERY_WINDOW, "rows": rows}


def baselines_panel(fleet: Fleet) -> list[dict[str, Any]]:
    return [
        {
            "target": target_label(b.model_name, b.adapter),
            "engine": b.engine_version or "unknown engine",
            "answer": b.answer[:80],
            "reason": b.reason.replace("_", " "),
            "recorded_at": iso(b.recorded_at),
            "by": b.recorded_by,
        }
        for b in GoldenBaseline.objects.filter(fleet=fleet).order_by("-recorded_at")[:BASELINE_ROWS]
    ]


def proof_context(fleet: Fleet, view: FleetView, now: datetime) -> dict[str, Any]:
    return {
        "readiness": readiness_panel(fleet, view, now),
        "drill": drill_panel(fleet, now),
        "recovery": recovery_panel(fleet),
        "baselines": baselines_panel(fleet),
    }
