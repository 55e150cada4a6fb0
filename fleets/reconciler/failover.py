"""The failover phase of a reconcile tick: escalation, pre-emption and the automatic failover.

Steps 3 and 4 of `fleets.reconciler.tick`: the pure core decides each (`should_escalate`,
`escalation_held`, `detect_failover` with the backoffs and the flap damping, `should_preempt`);
these functions read what it needs, call it, and hand its answer to the service that acts on it,
whose UPDATE re-checks every condition.

- `maybe_escalate`: an active degraded past `degradedGraceMs` becomes failed, unless its data
  path still serves (then, once per degraded spell, `domain.degraded.held`);
- `maybe_preempt`: a lost active ends an in-flight operation that cannot lead to a serving
  domain (fleets.core.preemption);
- `maybe_fail_over`: the promotion the core calls for (`reason="auto_failover"`), or the
  rate-limited record of why none can start (no viable standby, backoff, damping).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from fleets.base import clock
from fleets.base.errors import InvalidTarget, OperationConflict
from fleets.core.failover import (
    FAILOVER_DAMPED,
    FailoverDecision,
    detect_failover,
    escalation_held,
    is_stale,
    should_escalate,
)
from fleets.core.flapping import Damping
from fleets.core.policy import Policy
from fleets.core.preemption import (
    PREEMPTED,
    Ending,
    InFlight,
    ending,
    leads_to_serving,
    should_preempt,
)
from fleets.core.read_model import FleetView
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, OperationKind
from fleets.models import Domain, Fleet, Operation
from fleets.reads.selectors import AUTO_FAILOVER, fleet_view
from fleets.reconciler import datapath
from fleets.services.escalation import (
    domain_escalate,
    domain_escalation_held_report,
    fleet_no_standby_clear,
    fleet_no_standby_report,
)
from fleets.services.events import event_record
from fleets.services.operations import (
    operation_cancel,
    operation_finish_early,
    operation_request,
)

log = logging.getLogger(__name__)

# How often "nobody can take over" is recorded while it stays true, per fleet and process.
NO_STANDBY_EVENT_EVERY_MS = 60_000


def maybe_escalate(
    fleet: Fleet, view: FleetView, policy: Policy, now: datetime, actor: str
) -> FleetView:
    """Escalate an active degraded past its grace; return the view as it stands after."""
    if view.active is None:
        return view
    degraded_since = (
        Domain.objects.filter(pk=view.active.id).values_list("state_updated_at", flat=True).first()
    )
    if should_escalate(view, now, degraded_since) and domain_escalate(
        domain_id=view.active.id,
        now=now,
        degraded_grace_ms=policy.degraded_grace_ms,
        heartbeat_stale_ms=policy.heartbeat_stale_ms,
        actor=actor,
        # The view's freshness takes the tick lease's sightings in; the UPDATE's own check
        # reads only the rows (`fleets.reads.sightings`).
        seen_fresh=[
            d.id
            for d in view.standbys
            if d.last_seen_at is not None and not is_stale(d, policy, now)
        ],
    ):
        return fleet_view(fleet)
    _note_escalation_held(fleet, view, policy, now, degraded_since, actor)
    return view


def _note_escalation_held(
    fleet: Fleet,
    view: FleetView,
    policy: Policy,
    now: datetime,
    degraded_since: datetime | None,
    actor: str,
) -> None:
    """Say so when the active outlasted its grace and only its data path keeps it: once per
    degraded spell, an event (the metric and the page read the same rule at their own time)."""
    active = view.active
    if active is None or degraded_since is None or not policy.auto_failover:
        return
    if not escalation_held(view, now):
        return
    if (now - degraded_since).total_seconds() * 1000 <= policy.degraded_grace_ms:
        return
    failing_since = (
        Domain.objects.filter(pk=active.id)
        .values_list("heartbeat_failing_since", flat=True)
        .first()
    )
    if domain_escalation_held_report(
        fleet_id=fleet.id,
        domain_id=active.id,
        degraded_since=degraded_since,
        now=now,
        degraded_grace_ms=policy.degraded_grace_ms,
        supervisor_failing_since=failing_since,
        actor=actor,
    ):
        log.warning(
            "fleet %s: active %s degraded for longer than its grace, not escalated: its model "
            "servers still serve (supervisor unreachable, data path serving)",
            fleet.slug,
            active.slug,
        )


def maybe_preempt(
    fleet: Fleet,
    view: FleetView,
    now: datetime,
    held: dict[str, datetime],
    damping: Damping | None,
    actor: str,
) -> bool:
    """End the in-flight operation if a lost active pre-empts it; True if none is left.

    Uncommitted, it is cancelled; a promotion whose routing committed (and whose domain routed
    to is the one lost) ends succeeded without its remaining best-effort steps on the old
    active (fleets.core.preemption). Either way the failover is requested in this same tick.
    """
    op = Operation.objects.filter(fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES).first()
    if op is None:
        return True
    decision = _detect(fleet, view, now, held, damping)
    current = InFlight(
        kind=op.kind,
        target_id=str(op.target_domain_id) if op.target_domain_id else None,
        routing_committed=op.routing_committed,
        current_step=op.current_step,
        drill_mode=op.drill_mode,
    )
    serving = leads_to_serving(view, current, now)
    if decision is None or not should_preempt(decision, current, leads_to_serving=serving):
        return False
    how = ending(current)
    if how == Ending.CANCEL:
        message = (
            f"pre-empted: the active is lost ({decision.reason}) and this {op.kind} of "
            f"{op.target_slug} does not lead to a serving domain; failing over"
        )
        if operation_cancel(operation_id=op.id, actor=actor, message=message, reason=PREEMPTED):
            log.warning("fleet %s: %s %s %s", fleet.slug, op.kind, op.id, message)
    elif how == Ending.SKIP_REST:
        message = (
            f"pre-empted: {op.target_slug}, routed to by this promotion, is lost "
            f"({decision.reason}); its remaining best-effort steps on the old active are not "
            "run; failing over"
        )
        skipped = operation_finish_early(
            operation_id=op.id, actor=actor, message=message, reason=PREEMPTED
        )
        if skipped:
            log.warning(
                "fleet %s: promotion %s succeeded without %s: %s",
                fleet.slug,
                op.id,
                ", ".join(skipped),
                message,
            )
    # Ending.NOT_YET: the switch is being recorded; the next tick finds a best-effort step.
    return not Operation.objects.filter(
        fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
    ).exists()


def _detect(
    fleet: Fleet,
    view: FleetView,
    now: datetime,
    held: dict[str, datetime],
    damping: Damping | None,
) -> FailoverDecision | None:
    active_id = view.active_domain_id
    first_failed = datapath.first_failed_at(fleet.id, active_id) if active_id else None
    return detect_failover(view, now, held, damping, first_failed)


def maybe_fail_over(
    fleet: Fleet,
    view: FleetView,
    now: datetime,
    held: dict[str, datetime],
    damping: Damping | None,
    actor: str,
    checkpoint: Callable[[], None] | None = None,
) -> bool:
    """Request the failover the core calls for; True if one was created."""
    decision = _detect(fleet, view, now, held, damping)
    if decision is None:
        fleet_no_standby_clear(fleet_id=fleet.id)
        return False
    if decision.target_id is None:
        _report_no_standby(fleet, view, now, decision, held, damping)
        return False
    # Honest timing: the outage began when a client could last be served (the last good
    # heartbeat, or a model server last seen serving) or when a request first failed,
    # whichever is earlier; not when the rules noticed.
    active = view.active
    outage_start = now
    if active is not None:
        started = active.outage_started_at(datapath.first_failed_at(fleet.id, active.id))
        if started is not None and started < now:
            outage_start = started
    if checkpoint is not None:
        checkpoint()  # the last moment a stop reaches before the promotion is written
    try:
        result = operation_request(
            fleet=fleet,
            kind=OperationKind.PROMOTE,
            target_domain_id=decision.target_id,
            actor=actor,
            reason=AUTO_FAILOVER,
            detected_at=outage_start,
        )
    except (OperationConflict, InvalidTarget) as exc:
        # Another tick (or an operator) got there first, or the target moved: next tick decides.
        log.info("fleet %s: auto-failover not requested: %s", fleet.slug, exc)
        return False
    if not result.created or result.operation is None:
        return False
    datapath.forget(fleet.id, view.active_domain_id)
    log.warning(
        "fleet %s: active %s lost (%s); promoting %s",
        fleet.slug,
        active.slug if active else None,
        decision.reason,
        result.target_slug,
    )
    event_record(
        fleet_id=fleet.id,
        operation_id=result.operation.id,
        domain_id=decision.target_id,
        kind="operation.auto_failover",
        actor=actor,
        data={
            "reason": decision.reason,
            "activeDomainId": view.active_domain_id,
            "targetDomainId": decision.target_id,
            "detectedAt": clock.iso(now),
            "outageStartedAt": clock.iso(outage_start),
        },
    )
    return True


def _report_no_standby(
    fleet: Fleet,
    view: FleetView,
    now: datetime,
    decision: FailoverDecision,
    held: dict[str, datetime],
    damping: Damping | None,
) -> None:
    if decision.reason == FAILOVER_DAMPED and damping is not None:
        if fleet_no_standby_report(
            fleet_id=fleet.id,
            active_domain_id=view.active_domain_id,
            now=now,
            every_ms=NO_STANDBY_EVENT_EVERY_MS,
            reason=decision.reason,
            next_attempt_at=damping.until,
            kind="failover.damped",
            more={
                "failovers": damping.failovers,
                "windowMs": view.policy.flap_window_ms,
                "holdDownMs": damping.confirm_ms,
                "lastFailoverAt": clock.iso(damping.last_at),
            },
        ):
            log.error(
                "fleet %s: the active is lost, failover damped (%d failovers lately): waiting "
                "%d ms for it to come back before failing over",
                fleet.slug,
                damping.failovers,
                damping.confirm_ms,
            )
        return
    if fleet_no_standby_report(
        fleet_id=fleet.id,
        active_domain_id=view.active_domain_id,
        now=now,
        every_ms=NO_STANDBY_EVENT_EVERY_MS,
        reason=decision.reason,
        next_attempt_at=min(held.values()) if held else None,
    ):
        log.error(
            "fleet %s: the active is lost and no standby can take over (%s)",
            fleet.slug,
            decision.reason,
        )
