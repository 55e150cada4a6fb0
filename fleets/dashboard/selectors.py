"""Read-only page data for the dashboard: the fleets overview and one fleet's page.

Everything the templates show is computed here (ages, percentages, step progress, chart
geometry), so templates stay declarative and the same data renders the full page and the live
fragments the browser re-fetches after each broadcast.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Max

from fleets.base.clock import iso
from fleets.core.allocation import gpu_allocations, plan_mismatches
from fleets.core.backoff import Backoff
from fleets.core.decisions import decide_demotion, decide_promotion
from fleets.core.failover import is_stale, is_viable_standby
from fleets.core.memory_bars import gpu_bars, report_error
from fleets.core.outage import during_outage, outage_start, span_ms
from fleets.core.preemption import Ending, InFlight, ending
from fleets.core.read_model import FleetView
from fleets.core.report import DomainReport, read_report
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    DomainRole,
    DomainState,
    InferenceState,
    OperationKind,
    OperationState,
    SlotKind,
    TrainingState,
    steps_for,
)
from fleets.core.urls import without_userinfo
from fleets.dashboard import chart as chart_mod
from fleets.dashboard.drift import drift_status, expected_fingerprint
from fleets.dashboard.proof import proof_context
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Slot
from fleets.reads.recovery import operation_failover_ms
from fleets.reads.selectors import failover_backoff_state, fleet_view

EVENT_LIMIT = 60
CHART_LIMIT = 24

# Event kinds an operator should notice at a glance in the timeline.
_BAD = ("operation.failed", "domain.failed", "domain.heartbeat.failed", "operation.cancelled")
_GOOD = ("fleet.route.switched", "operation.succeeded")
_WARN = (
    "domain.degraded",
    "operation.step.timeout_best_effort",
    "domain.degraded.escalated",
    "operation.step.retry",
)
RETRY_EVENT = "operation.step.retry"


def _age_s(then: datetime | None, now: datetime) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def _elapsed_ms(then: datetime, now: datetime) -> int:
    return int(max(0.0, (now - then).total_seconds()) * 1000)


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


def _placement_text(placement: Any) -> str:
    if not isinstance(placement, dict) or not placement:
        return ""
    parts = [str(placement[k]) for k in ("cloud", "region") if isinstance(placement.get(k), str)]
    accel = placement.get("accelerator")
    if accel:
        count = placement.get("acceleratorCount") or 1
        parts.append(f"{count}× {accel}")
    if placement.get("useSpot"):
        parts.append("spot")
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------------


def fleet_health(
    view: FleetView, now: datetime, heartbeat_errors: dict[str, str] | None = None
) -> tuple[str, list[str]]:
    """Return ("ok" | "warn" | "bad", reasons) for the fleet at a glance.

    `heartbeat_errors` maps domain id to the error of its failing heartbeat, if any.
    """
    reasons: list[str] = []
    active = view.active
    level = "ok"
    if active is None:
        return "bad", ["no active domain: nothing serves traffic"]
    failing = (heartbeat_errors or {}).get(active.id)
    if active.state in (DomainState.FAILED, DomainState.STOPPING, DomainState.STOPPED):
        level = "bad"
        reasons.append(f"active {active.slug} is {active.state}")
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


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


def operation_progress(
    op: Operation, step_events: list[Event], now: datetime, slugs: dict
) -> dict[str, Any]:
    """Return the step-by-step view of one operation: each step's status and elapsed time."""
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
        entry["elapsed"] = chart_mod.fmt_ms(entry["ms"]) if entry["ms"] is not None else ""
        steps.append(entry)
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
        "failover": chart_mod.fmt_ms(figure) if figure is not None else "",
        # Until routing moves a cancel ends the operation cancelled; after, it ends a
        # promotion succeeded without its best-effort steps (not in the instant between the
        # switch and its record, when the service asks to retry).
        "can_cancel": running and ending_of != Ending.NOT_YET,
        "cancel_skips_rest": running and ending_of == Ending.SKIP_REST,
        "cleanup": op.cleanup,
        "error": error,
        "steps": steps,
        "total": chart_mod.fmt_ms(total_ms) if total_ms is not None else "",
    }


def _step_events(op_ids: list) -> dict[Any, list[Event]]:
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


def failover_chart(fleet: Fleet, slugs: dict) -> chart_mod.Chart:
    """Build the chart of the fleet's last succeeded promotions, per-step durations stacked."""
    ops = list(
        Operation.objects.filter(
            fleet=fleet, kind=OperationKind.PROMOTE, state=OperationState.SUCCEEDED
        ).order_by("-finished_at")[:CHART_LIMIT]
    )
    ops.reverse()
    events = _step_events([op.id for op in ops])
    samples = []
    for op in ops:
        durations: dict[str, int] = {}
        outcomes: dict[str, str] = {}
        for e in events.get(op.id, []):
            if e.duration_ms is not None and e.step not in durations:
                durations[e.step] = max(0, e.duration_ms)
                if e.kind != "operation.step.done":
                    outcomes[e.step] = e.kind.removeprefix("operation.step.")
        if during_outage(kind=op.kind, detected_at=op.detected_at, source_state=op.source_state):
            start = outage_start(detected_at=op.detected_at, source_seen_at=op.source_seen_at)
            detection = span_ms(start, op.started_at)
            if detection:
                durations["detection"] = detection
        samples.append(
            chart_mod.FailoverSample(
                operation_id=str(op.id),
                finished_at=op.finished_at or op.created_at,
                reason=op.reason,
                target=slugs.get(op.target_domain_id) or op.target_domain_slug or "?",
                durations_ms=durations,
                failover_ms=operation_failover_ms(op),
                outcomes=outcomes,
            )
        )
    return chart_mod.build_chart(samples)


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


def _event_summary(e: Event, slugs: dict) -> str:
    data = e.data if isinstance(e.data, dict) else {}
    bits = []
    if "from" in data and "to" in data:
        bits.append(f"{data['from']} → {data['to']}")
    if "fromDomainId" in data and data.get("toDomainId"):
        src = slugs.get(_uuid_or_none(data.get("fromDomainId")), "none")
        dst = slugs.get(_uuid_or_none(data.get("toDomainId")), "?")
        bits.append(f"{src} → {dst}")
    elif data.get("fromDomainId"):
        bits.append(f"from {slugs.get(_uuid_or_none(data['fromDomainId']), '?')}")
    if data.get("revision") is not None:
        bits.append(f"revision {data['revision']}")
    if data.get("code"):
        bits.append(str(data["code"]))
    for key in ("message", "reason"):
        if isinstance(data.get(key), str) and data[key]:
            bits.append(data[key])
    text = " · ".join(str(b) for b in bits)
    return text if len(text) <= 240 else text[:237] + "..."


def _uuid_or_none(value):
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def _event_level(kind: str) -> str:
    if kind in _BAD or kind.endswith(".failed") or kind.endswith(".timeout"):
        return "bad"
    if kind in _GOOD:
        return "good"
    if kind in _WARN or "degraded" in kind:
        return "warn"
    return ""


def recent_events(fleet: Fleet, slugs: dict, limit: int = EVENT_LIMIT) -> list[dict[str, Any]]:
    """Return the fleet's newest events, newest first, ready to render."""
    rows = Event.objects.filter(fleet=fleet).order_by("-id")[:limit]
    return [
        {
            "id": e.id,
            "kind": e.kind,
            "level": _event_level(e.kind),
            "created_at": iso(e.created_at),
            "time": e.created_at.strftime("%H:%M:%S.") + f"{e.created_at.microsecond // 1000:03d}",
            "domain": slugs.get(e.domain_id, ""),
            "step": e.step,
            "duration": chart_mod.fmt_ms(e.duration_ms) if e.duration_ms is not None else "",
            "actor": e.actor,
            "summary": _event_summary(e, slugs),
            "operation": str(e.operation_id)[:8] if e.operation_id else "",
        }
        for e in rows
    ]


# ---------------------------------------------------------------------------------------------
# Domains
# ---------------------------------------------------------------------------------------------


# What a slot state proves about its models when it changed after the last heartbeat: the
# operation that moved it checked the supervisor itself (a wake proven, a probe passed).
_POSTURE_OF_SLOT: dict[str, str] = {
    InferenceState.SERVING: "awake",
    InferenceState.PROBING: "awake",
    InferenceState.WAKING: "waking",
    InferenceState.SLEEPING: "asleep",
}


def _posture(seen, slot: Slot, report_at: datetime | None) -> str:
    """Return a model's posture: the heartbeat's word, unless the slot moved since then.

    Without this, a freshly promoted active read `serving` with its models `asleep` until the
    next heartbeat replaced the report taken before the wake.
    """
    newer = report_at is None or (
        slot.state_updated_at is not None and slot.state_updated_at > report_at
    )
    if newer and slot.state in _POSTURE_OF_SLOT:
        return _POSTURE_OF_SLOT[slot.state]
    if seen is None:
        return "unreported"
    if seen.sleeping is None:
        return "unknown"
    return "asleep" if seen.sleeping else "awake"


def _serving_note(d: Domain, stale: bool, failing: str | None, inference: list) -> str:
    """Return why an active domain is not serving traffic, or "" when it is."""
    if d.state in (DomainState.FAILED, DomainState.STOPPING, DomainState.STOPPED):
        return f"domain {d.state}"
    if failing:
        return f"heartbeat failing: {failing}"
    if stale:
        return "heartbeat stale"
    down = [
        f"gpu{s['gpu_index']} {s['state']}"
        for s in inference
        if s["state"] != InferenceState.SERVING
    ]
    if down:
        return "inference " + ", ".join(down)
    if not inference:
        return "no inference slot"
    return ""


def _backoff_text(backoff: Backoff | None, now: datetime) -> str:
    """One line for a standby auto-failover is holding back after failed attempts."""
    if backoff is None or backoff.next_attempt_at <= now:
        return ""
    wait = fmt_age(_age_s(now, backoff.next_attempt_at))
    failures = f"{backoff.failures} failed automatic promotion{'s' if backoff.failures > 1 else ''}"
    return f"{failures} in a row; auto-failover tries it again in {wait}"


def _inference_rows(
    d: Domain, slots: list[Slot], bindings: list[ModelBinding], report: DomainReport
) -> list[dict[str, Any]]:
    """One row per inference slot: its state, and each bound model as last reported."""
    models_seen = report.models()
    rows = []
    for s in sorted((s for s in slots if s.kind == SlotKind.INFERENCE), key=lambda s: s.gpu_index):
        models = []
        for b in sorted((b for b in bindings if b.slot_id == s.id), key=lambda b: b.name):
            seen = models_seen.get(b.name)
            expected = expected_fingerprint(b.profile, model_name=b.name, gpu_index=s.gpu_index)
            reported_fp = seen.fingerprint if seen else None
            models.append(
                {
                    "name": b.name,
                    "serving_url": without_userinfo(b.serving_url),
                    "posture": _posture(seen, s, d.last_seen_at),
                    "error": seen.error if seen else None,
                    "drift": drift_status(reported_fp, expected),
                    "expected_fp": (expected or "")[:19],
                    "reported_fp": (reported_fp or "")[:19],
                }
            )
        rows.append(
            {
                "gpu_index": s.gpu_index,
                "state": s.state,
                "since": iso(s.state_updated_at),
                "models": models,
            }
        )
    return rows


def _training_rows(slots: list[Slot], report: DomainReport, now: datetime) -> list[dict[str, Any]]:
    """One row per training slot: its state, and its trainer as last reported."""
    training_seen = report.trainings()
    rows = []
    for s in sorted((s for s in slots if s.kind != SlotKind.INFERENCE), key=lambda s: s.gpu_index):
        seen = training_seen.get(s.gpu_index)
        # PIDs only while the slot trains: a report taken before a stop still lists them.
        live = s.state in (TrainingState.TRAINING, TrainingState.STOPPING)
        pids = (list(seen.pids) if seen and seen.pids else list(s.pids or [])) if live else []
        checkpoint = seen.checkpoint_at if seen else None
        rows.append(
            {
                "gpu_index": s.gpu_index,
                "state": s.state,
                "since": iso(s.state_updated_at),
                "reported_state": seen.state if seen else None,
                "pids": pids,
                "checkpoint_at": iso(checkpoint),
                "checkpoint_age": fmt_age(_age_s(checkpoint, now)) if checkpoint else "",
                "last_error": seen.last_error if seen else None,
            }
        )
    return rows


def _report_fields(
    report: DomainReport, slots: list[Slot], bindings: list[ModelBinding]
) -> dict[str, Any]:
    """What the card shows of the last report itself: GPU memory, the plan, the last error."""
    return {
        "report_error": report_error(report),
        "gpus": gpu_bars(report, sorted({s.gpu_index for s in slots})),
        "allocations": gpu_allocations(slots, bindings, report),
        "plan_mismatches": plan_mismatches(report),
        "has_report": not report.empty,
    }


def _moves(d: Domain, view: FleetView, role: str) -> dict[str, Any]:
    """Which operator moves make sense for the domain now, and why not."""
    promote = decide_promotion(view, str(d.id))
    demote = decide_demotion(view, str(d.id))
    return {
        "can_promote": promote.outcome == "proceed",
        "promote_note": promote.message,
        "can_demote": demote.outcome == "proceed",
        "demote_note": demote.message,
        # Haru-provisioned domains: where provisioning stands, and which moves make sense now.
        "managed": bool(d.driver),
        "provisioning": _provisioning_text(d),
        "can_provision": bool(d.driver)
        and role != DomainRole.ACTIVE
        and d.state in (DomainState.FAILED, DomainState.STOPPED),
        "can_stop": bool(d.driver)
        and role != DomainRole.ACTIVE
        and d.state not in (DomainState.STOPPING, DomainState.STOPPED),
    }


def _domain_card(
    d: Domain,
    view: FleetView,
    slots: list[Slot],
    bindings: list[ModelBinding],
    now: datetime,
    backoff: Backoff | None = None,
) -> dict[str, Any]:
    dview = view.domain(str(d.id))
    report = read_report(d.last_report)
    role = DomainRole.ACTIVE if str(d.id) == view.active_domain_id else DomainRole.STANDBY
    inference = _inference_rows(d, slots, bindings, report)
    stale = bool(dview and is_stale(dview, view.policy, now))
    serving_note = (
        _serving_note(d, stale, _heartbeat_error(report), inference)
        if role == DomainRole.ACTIVE
        else ""
    )
    return {
        "id": str(d.id),
        "slug": d.slug,
        "display_name": d.display_name,
        "role": role,
        "state": d.state,
        "state_since": iso(d.state_updated_at),
        "provider": d.provider,
        "placement": _placement_text(d.placement),
        "priority": d.priority,
        "supervisor_url": without_userinfo(d.supervisor_url),
        "serving_base_url": without_userinfo(d.serving_base_url),
        "last_seen_at": iso(d.last_seen_at),
        "heartbeat_age": fmt_age(_age_s(d.last_seen_at, now)),
        "stale": stale,
        **_report_fields(report, slots, bindings),
        "inference": inference,
        "training": _training_rows(slots, report, now),
        "serving": role == DomainRole.ACTIVE and not serving_note,
        "serving_note": serving_note,
        "failover_backoff": _backoff_text(backoff, now),
        "failover_next_attempt_at": iso(backoff.next_attempt_at) if backoff else None,
        **_moves(d, view, role),
    }


def _provisioning_text(d) -> str:
    """One line for the card: phase, where, and the last driver error if any."""
    if not d.driver:
        return ""
    status = d.driver_status or {}
    parts = [status.get("phase") or "not launched"]
    if status.get("where"):
        parts.append(f"in {status['where']}")
    error = status.get("lastError")
    if isinstance(error, dict) and error.get("code"):
        parts.append(f"last error {error['code']}: {str(error.get('message', ''))[:160]}")
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------


def fleet_page(fleet: Fleet, *, now: datetime) -> dict[str, Any]:
    """Return everything the fleet page (and its live fragment) renders."""
    view = fleet_view(fleet)  # refreshes the pointer, revision and policy
    domains = list(Domain.objects.filter(fleet=fleet).order_by("priority", "slug"))
    slots = list(Slot.objects.filter(domain__fleet=fleet))
    bindings = list(ModelBinding.objects.filter(domain__fleet=fleet))
    slugs = {d.id: d.slug for d in domains}
    backoffs = failover_backoff_state(fleet.id, view.policy)
    cards = [
        _domain_card(
            d,
            view,
            [s for s in slots if s.domain_id == d.id],
            [b for b in bindings if b.domain_id == d.id],
            now,
            backoffs.get(str(d.id)),
        )
        for d in domains
    ]
    # Active first: the operator's eye goes to what serves.
    cards.sort(key=lambda c: c["role"] != DomainRole.ACTIVE)

    in_flight = Operation.objects.filter(fleet=fleet, state__in=IN_FLIGHT_OPERATION_STATES).first()
    last = in_flight or Operation.objects.filter(fleet=fleet).order_by("-created_at").first()
    operation = None
    if last is not None:
        step_events = _step_events([last.id]).get(last.id, [])
        operation = operation_progress(last, step_events, now, slugs)
    events = recent_events(fleet, slugs)
    health, reasons = fleet_health(view, now, _heartbeat_errors(domains))
    return {
        "fleet": {
            "id": str(fleet.id),
            "slug": fleet.slug,
            "display_name": fleet.display_name,
            "route_revision": view.route_revision,
            "active_domain_id": view.active_domain_id,
            "active_slug": view.active.slug if view.active else "",
            "auto_failover": view.policy.auto_failover,
            "heartbeat_stale_ms": view.policy.heartbeat_stale_ms,
        },
        "health": health,
        "health_reasons": reasons,
        "domains": cards,
        "operation": operation,
        "operation_in_flight": in_flight is not None,
        "events": events,
        "last_event_id": events[0]["id"] if events else 0,
        "chart": failover_chart(fleet, slugs),
        "generated_at": iso(now),
        **proof_context(fleet, view, now),
    }


def _heartbeat_error(report: DomainReport) -> str | None:
    """The message of the domain's failing heartbeat; None when its last one answered."""
    note = report.heartbeat
    if note is None or note.ok:
        return None
    message = note.error.message if note.error is not None else ""
    return (message or "unreachable")[:120]


def _heartbeat_errors(domains) -> dict[str, str]:
    """Map domain id to the message of its failing heartbeat (domains whose last one failed)."""
    errors = {str(d.id): _heartbeat_error(read_report(d.last_report)) for d in domains}
    return {domain_id: message for domain_id, message in errors.items() if message is not None}


def overview_rows(*, now: datetime) -> list[dict[str, Any]]:
    """Return one row per fleet: active domain, revision, health, the in-flight operation."""
    rows = []
    in_flight = {
        op.fleet_id: op
        for op in Operation.objects.filter(state__in=IN_FLIGHT_OPERATION_STATES).select_related(
            "target_domain"
        )
    }
    # When clients were last served by a newly promoted domain (served_at, the routing commit),
    # not when the last promotion finished: a promotion is still running its best-effort steps
    # on the old active for up to sleepTimeoutMs after the switch. A round-trip drill's switches
    # are rehearsals, not failovers.
    last_failover = dict(
        Operation.objects.filter(kind=OperationKind.PROMOTE, served_at__isnull=False)
        .values("fleet_id")
        .annotate(at=Max("served_at"))
        .values_list("fleet_id", "at")
    )
    domains_by_fleet: dict[Any, list[Domain]] = defaultdict(list)
    for d in Domain.objects.only("id", "fleet_id", "last_report"):
        domains_by_fleet[d.fleet_id].append(d)
    for fleet in Fleet.objects.all().order_by("slug"):
        view = fleet_view(fleet)
        health, reasons = fleet_health(view, now, _heartbeat_errors(domains_by_fleet[fleet.id]))
        op = in_flight.get(fleet.id)
        lf = last_failover.get(fleet.id)
        rows.append(
            {
                "id": str(fleet.id),
                "slug": fleet.slug,
                "display_name": fleet.display_name,
                "active_slug": view.active.slug if view.active else "",
                "active_state": view.active.state if view.active else "",
                "route_revision": view.route_revision,
                "auto_failover": view.policy.auto_failover,
                "health": health,
                "health_reasons": reasons,
                "domains": [
                    {
                        "id": d.id,
                        "slug": d.slug,
                        "role": DomainRole.ACTIVE
                        if d.id == view.active_domain_id
                        else DomainRole.STANDBY,
                        "state": d.state,
                        "stale": is_stale(d, view.policy, now),
                        "heartbeat_age": fmt_age(_age_s(d.last_seen_at, now)),
                        "last_seen_at": iso(d.last_seen_at),
                    }
                    for d in sorted(
                        view.domains, key=lambda d: (d.id != view.active_domain_id, d.slug)
                    )
                ],
                "operation": (
                    {
                        "kind": op.kind,
                        "state": op.state,
                        "target": op.target_slug,
                        "current_step": op.current_step,
                        "step_started_at": iso(op.step_started_at),
                        "reason": op.reason,
                    }
                    if op
                    else None
                ),
                "last_failover_at": iso(lf) if lf else None,
                "last_failover_age": fmt_age(_age_s(lf, now)) if lf else "",
            }
        )
    return rows


def heartbeats(*, now: datetime, fleet: Fleet | None = None) -> dict[str, Any]:
    """Every domain's last good heartbeat (the API's `lastSeenAt`, the same column) and whether
    it reads stale, for the page's once-a-second poll: ages tick from this, not from a
    fragment re-fetched every few seconds (which made a healthy fleet's age climb to 5 s)."""
    fleets = [fleet] if fleet is not None else list(Fleet.objects.all())
    domains: dict[str, Any] = {}
    for f in fleets:
        view = fleet_view(f)
        for d in view.domains:
            domains[d.id] = {
                "lastSeenAt": iso(d.last_seen_at),
                "stale": is_stale(d, view.policy, now),
            }
    return {"generatedAt": iso(now), "domains": domains}
