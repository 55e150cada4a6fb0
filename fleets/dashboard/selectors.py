"""Read-only page data for the dashboard: the fleets overview and one fleet's page.

Everything the templates show is computed here (ages, percentages, step progress, chart
geometry), so templates stay declarative and the same data renders the full page and the live
fragments the browser re-fetches after each broadcast.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Max

from fleets.base.clock import iso
from fleets.core.allocation import gpu_allocations, plan_mismatches
from fleets.core.backoff import Backoff
from fleets.core.decisions import decide_demotion, decide_promotion
from fleets.core.failover import is_stale
from fleets.core.memory_bars import gpu_bars, report_error
from fleets.core.outage import during_outage, outage_start, span_ms
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
)
from fleets.core.urls import without_userinfo
from fleets.dashboard import chart as chart_mod
from fleets.dashboard.adapters import adapters_panel
from fleets.dashboard.drift import drift_status, expected_fingerprint
from fleets.dashboard.progress import RETRY_EVENT, operation_progress, step_events
from fleets.dashboard.proof import proof_context
from fleets.dashboard.rollout import rollout_panel
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Slot
from fleets.reads.fleet_health import (
    age_s,
    fleet_health,
    fmt_age,
    heartbeat_error,
    heartbeat_errors,
)
from fleets.reads.fleet_list import (
    FleetStatus,
    fleet_rows,
    healths,
    in_flight_operations,
    search,
    with_status,
)
from fleets.reads.recovery import operation_failover_ms
from fleets.reads.selectors import failover_backoff_state, failover_damping_state, fleet_view
from fleets.reads.sightings import overlaid
from fleets.reads.snapshot import consistent_read

EVENT_LIMIT = 60
# At most this many retry events are read for one page (a step failing once a second for over
# an hour); past it the timeline starts at the oldest one read.
RETRY_SCAN_LIMIT = 5000
CHART_LIMIT = 24

# Event kinds an operator should notice at a glance in the timeline.
_BAD = ("operation.failed", "domain.failed", "domain.heartbeat.failed", "operation.cancelled")
_GOOD = ("fleet.route.switched", "operation.succeeded")
_WARN = (
    "domain.degraded",
    "operation.step.timeout_best_effort",
    "domain.degraded.escalated",
    "domain.degraded.held",
    "failover.damped",
    "operation.step.retry",
)


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


def failover_chart(fleet: Fleet, slugs: dict) -> chart_mod.Chart:
    """Build the chart of the fleet's last succeeded promotions, per-step durations stacked."""
    ops = list(
        Operation.objects.filter(
            fleet=fleet, kind=OperationKind.PROMOTE, state=OperationState.SUCCEEDED
        ).order_by("-finished_at")[:CHART_LIMIT]
    )
    ops.reverse()
    events = step_events([op.id for op in ops])
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
    # One line: a supervisor's error often quotes a JSON body over several lines.
    text = " ".join(" · ".join(str(b) for b in bits).split())
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


def _retry_key(e: Event) -> tuple[Any, str, str] | None:
    """What makes two retries "the same": their operation, step and error message."""
    if e.kind != RETRY_EVENT:
        return None
    data = e.data if isinstance(e.data, dict) else {}
    return (e.operation_id, e.step, str(data.get("message", "")))


def _timeline_rows(fleet: Fleet, limit: int) -> list[list[Event]]:
    """Return the fleet's newest `limit` timeline lines, newest first, each a run of events:
    one event, or consecutive retries of one step failing the same way (newest first).

    A failing wake writes a retry event every second or so; listed one a line they pushed the
    crash's own events out of the timeline within a minute. The rows stay one per attempt (the
    audit trail, each attempt's number and every count read from them stay exact); only the
    page folds them, so every other event is read by its own query, past any number of
    retries."""
    others = list(
        Event.objects.filter(fleet=fleet).exclude(kind=RETRY_EVENT).order_by("-id")[:limit]
    )
    floor = others[-1].id if len(others) == limit else 0
    retries = list(
        Event.objects.filter(fleet=fleet, kind=RETRY_EVENT, id__gt=floor).order_by("-id")[
            :RETRY_SCAN_LIMIT
        ]
    )
    if len(retries) == RETRY_SCAN_LIMIT:
        # More retries than one page reads: show the newest ones, and nothing older than them,
        # so no line stands next to a gap.
        floor = retries[-1].id
        others = [e for e in others if e.id > floor]
    runs: list[list[Event]] = []
    for e in sorted([*others, *retries], key=lambda e: e.id, reverse=True):
        key = _retry_key(e)
        if key is not None and runs and _retry_key(runs[-1][0]) == key:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs[:limit]


def _attempt(e: Event) -> Any:
    return (e.data if isinstance(e.data, dict) else {}).get("attempt", "?")


def recent_events(fleet: Fleet, slugs: dict, limit: int = EVENT_LIMIT) -> list[dict[str, Any]]:
    """Return the fleet's newest timeline lines, newest first, ready to render; repeated
    retries of a step (same operation, step and error) fold into one line with their count."""
    lines = []
    for run in _timeline_rows(fleet, limit):
        e, first = run[0], run[-1]
        summary = _event_summary(e, slugs)
        if len(run) > 1:
            summary = f"attempts {_attempt(first)}–{_attempt(e)} · {summary}"
        lines.append(
            {
                "id": e.id,
                "kind": e.kind,
                "level": _event_level(e.kind),
                "created_at": iso(e.created_at),
                "time": _clock_text(e.created_at),
                "count": len(run),
                "first_at": iso(first.created_at),
                "first_time": _clock_text(first.created_at),
                "domain": slugs.get(e.domain_id, ""),
                "step": e.step,
                "duration": chart_mod.fmt_ms(e.duration_ms) if e.duration_ms is not None else "",
                "actor": e.actor,
                "summary": summary,
                "operation": str(e.operation_id)[:8] if e.operation_id else "",
            }
        )
    return lines


def _clock_text(at: datetime) -> str:
    return at.strftime("%H:%M:%S.") + f"{at.microsecond // 1000:03d}"


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


# A host in these states is not answering (or not meant to): its last report is history.
_UNREACHABLE_STATES = frozenset({DomainState.FAILED, DomainState.STOPPING, DomainState.STOPPED})


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
    wait = fmt_age(age_s(now, backoff.next_attempt_at))
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
                "checkpoint_age": fmt_age(age_s(checkpoint, now)) if checkpoint else "",
                "last_error": seen.last_error if seen else None,
            }
        )
    return rows


def _report_fields(
    report: DomainReport, slots: list[Slot], bindings: list[ModelBinding], inference: list
) -> dict[str, Any]:
    """What the card shows of the last report itself: GPU memory, the plan, the last error."""
    allocations = gpu_allocations(slots, bindings, report)
    # A server's posture in the memory table is the slot list's (`_posture`): a promotion that
    # proved a wake after the last heartbeat showed the model "asleep" in one and "awake" in
    # the other.
    asleep = {"awake": False, "asleep": True}
    postures = {m["name"]: m["posture"] for row in inference for m in row["models"]}
    for gpu in allocations:
        for w in gpu.workloads:
            if w.kind == "server" and postures.get(w.name) in asleep:
                w.asleep = asleep[postures[w.name]]
    return {
        "report_error": report_error(report),
        "gpus": gpu_bars(report, sorted({s.gpu_index for s in slots})),
        "allocations": allocations,
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
    failing = heartbeat_error(report)
    serving_note = _serving_note(d, stale, failing, inference) if role == DomainRole.ACTIVE else ""
    # Everything drawn from the report (memory bars, model postures, trainer pids, the slot
    # list) is what the host said at its last good heartbeat: once it stops answering, that
    # is history, and a crashed host's card must not stay green with it.
    report_stale = d.last_seen_at is not None and bool(
        stale or failing or d.state in _UNREACHABLE_STATES
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
        "heartbeat_age": fmt_age(age_s(d.last_seen_at, now)),
        "stale": stale,
        "report_stale": report_stale,
        "report_clock": d.last_seen_at.strftime("%H:%M:%S") if d.last_seen_at else "",
        **_report_fields(report, slots, bindings, inference),
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
    """Return everything the fleet page (and its live fragment) renders, read from one
    snapshot of the database: the header, the cards, the operation and the timeline agree."""
    with consistent_read():
        return _fleet_page(fleet, now=now)


def _fleet_page(fleet: Fleet, *, now: datetime) -> dict[str, Any]:
    view = fleet_view(fleet)  # refreshes the pointer, revision and policy
    domains = overlaid(
        list(Domain.objects.filter(fleet=fleet).order_by("priority", "slug")), [fleet.pk]
    )
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
        operation = operation_progress(last, step_events([last.id]).get(last.id, []), now, slugs)
    events = recent_events(fleet, slugs)
    damping = failover_damping_state(fleet.id, view.policy, now)
    health, reasons = fleet_health(view, now, heartbeat_errors(domains), damping)
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
        "rollout": rollout_panel(fleet, slugs, now),
        "adapters": adapters_panel(fleet, now),
        "generated_at": iso(now),
        **proof_context(fleet, view, now),
    }


# Fleets on one overview page: a page of 1,000 rows took seconds to render and to read.
OVERVIEW_PAGE_SIZE = 50


def overview_page(
    *,
    now: datetime,
    visible: frozenset[str] | None,
    text: str | None = None,
    status: FleetStatus | None = None,
    page: int | str | None = 1,
    per_page: int = OVERVIEW_PAGE_SIZE,
) -> dict[str, Any]:
    """Return one page of the overview: the fleets `visible` (None: every fleet) whose slug or
    name contains `text`, in `status`, by slug; with the page's numbers for its links. The
    selection and the rows are read from one snapshot of the database."""
    with consistent_read():
        fleets = search(Fleet.objects.order_by("slug"), text)
        if visible is not None:
            fleets = fleets.filter(pk__in=list(visible))
        chosen: Any = with_status(fleets, status, now) if status is not None else fleets
        current = Paginator(chosen, per_page).get_page(page)
        return {
            "rows": _overview_rows(now=now, fleets=list(current.object_list)),
            "page": current,
        }


def overview_rows(*, now: datetime, fleets: list[Fleet] | None = None) -> list[dict[str, Any]]:
    """Return one row per fleet (default: every fleet, by slug): active domain, revision,
    health, the in-flight operation (every row read from one snapshot of the database)."""
    with consistent_read():
        if fleets is None:
            fleets = list(Fleet.objects.order_by("slug"))
        return _overview_rows(now=now, fleets=fleets)


def _overview_rows(*, now: datetime, fleets: list[Fleet]) -> list[dict[str, Any]]:
    """The rows of `fleets`, in a number of queries that does not grow with them."""
    rows = []
    ids = [f.pk for f in fleets]
    read = fleet_rows(fleets)
    in_flight = in_flight_operations(ids)
    # When clients were last served by a newly promoted domain (served_at, the routing commit),
    # not when the last promotion finished: a promotion is still running its best-effort steps
    # on the old active for up to sleepTimeoutMs after the switch. A round-trip drill's switches
    # are rehearsals, not failovers.
    last_failover = dict(
        Operation.objects.filter(
            fleet_id__in=ids, kind=OperationKind.PROMOTE, served_at__isnull=False
        )
        .values("fleet_id")
        .annotate(at=Max("served_at"))
        .values_list("fleet_id", "at")
    )
    judged = healths(read, now)
    for fleet in fleets:
        view = read.view(fleet)
        health, reasons = judged[fleet.pk]
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
                        "heartbeat_age": fmt_age(age_s(d.last_seen_at, now)),
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
                "last_failover_age": fmt_age(age_s(lf, now)) if lf else "",
            }
        )
    return rows


def heartbeats(
    *, now: datetime, fleet: Fleet | None = None, fleet_ids: frozenset[str] | None = None
) -> dict[str, Any]:
    """Every domain's last good heartbeat (the API's `lastSeenAt`, the same column) and whether
    it reads stale, for the page's once-a-second poll: ages tick from this, not from a
    fragment re-fetched every few seconds (which made a healthy fleet's age climb to 5 s).
    One `fleet`, or the fleets of `fleet_ids` (None: every fleet)."""
    if fleet is not None:
        fleets = [fleet]
    elif fleet_ids is not None:
        fleets = list(Fleet.objects.filter(pk__in=list(fleet_ids)))
    else:
        fleets = list(Fleet.objects.all())
    domains: dict[str, Any] = {}
    read = fleet_rows(fleets)
    for f in fleets:
        view = read.view(f)
        for d in view.domains:
            domains[d.id] = {
                "lastSeenAt": iso(d.last_seen_at),
                "stale": is_stale(d, view.policy, now),
            }
    return {"generatedAt": iso(now), "domains": domains}
