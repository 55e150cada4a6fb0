"""Operations: request (create or join), start, advance a step, succeed, fail, cancel, and end a
promotion that moved routing without its remaining best-effort steps.

Creation is race-free through the partial unique constraint "one pending/running operation per
fleet": the INSERT either wins, or loses to the in-flight row, which the request then joins (same
kind and target) or reports as a conflict.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.dispatch import Signal

from fleets.base import clock
from fleets.base.errors import (
    ErrorCode,
    InvalidTarget,
    OperationConflict,
    OperationNotCancellable,
    OperationNotFound,
)
from fleets.core.decisions import Decision, RequestStatus, decide_demotion, decide_promotion
from fleets.core.drills import decide_drill
from fleets.core.outage import during_outage
from fleets.core.preemption import Ending, InFlight, ending, steps_left
from fleets.core.read_model import DomainView, FleetView
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    CleanupState,
    DrillMode,
    InferenceState,
    OperationErrorCode,
    OperationKind,
    OperationState,
    SlotKind,
    TrainingState,
    check_transition,
    steps_for,
)
from fleets.models import Domain, Fleet, Id, Operation, Rollout, Slot
from fleets.reads.selectors import fleet_view
from fleets.reads.sightings import sightings_of
from fleets.services.events import EventFields, event_record, guarded_update
from fleets.services.transitions import slot_transition

# Sent after commit with `fleet_id` and `operation_id` whenever an operation is created, so the
# reconciler can start it at once instead of at the next beat (fleets/reconciler/kick.py).
operation_created = Signal()
# Sent after commit with `fleet_id` when an operator or a pre-emption ends an operation: its
# clean-up, and whatever waited behind it, should not wait for the next beat.
operation_ended = Signal()


def _send_after_commit(signal: Signal, **kwargs: str) -> None:
    transaction.on_commit(functools.partial(signal.send, sender=Operation, **kwargs))


@dataclass(frozen=True)
class RequestResult:
    status: RequestStatus  # ALREADY_ACTIVE or ACCEPTED
    operation: Operation | None
    created: bool
    route_revision: int
    target_slug: str  # the slug of the domain the request's reference resolved to


def operation_request(
    *,
    fleet: Fleet,
    kind: str,
    target_domain_id: str | None,
    actor: str = "api",
    reason: str = "manual",
    detected_at: datetime | None = None,
    drill_mode: str = DrillMode.CHECK,
) -> RequestResult:
    """Create a promote/demote/drill operation, or join the in-flight one with the same kind
    and target.

    `target_domain_id` is a domain id or slug (None for a drill: the standby a failover would
    take); the core's decision resolves it, once. `drill_mode` (DrillMode) says what a drill
    proves; a round trip also needs automatic failover on. Raises
    InvalidTarget when the core refuses the target and OperationConflict when another operation
    is in flight.
    """
    view = fleet_view(fleet)
    decision = _decide(view, fleet, kind, target_domain_id, drill_mode)
    if decision.outcome == "reject" or decision.target is None:
        raise InvalidTarget(decision.message)
    target = decision.target
    active = view.active
    if (
        detected_at is None
        and active is not None
        and during_outage(kind=kind, detected_at=None, source_state=active.state)
    ):
        # An operator's promotion away from a failed active answers an outage too: it keeps
        # when that outage began, by the rule an automatic failover uses, so its figure counts
        # the time it took to notice and act (fleets/core/outage.py).
        detected_at = active.outage_started_at()
    _refuse_beside_rollout(fleet, kind, reason, active)
    if decision.outcome == "noop":
        # "Already there" is only true if nothing is moving the fleet away from there: while
        # another operation is in flight the answer is that operation, as for any request.
        moving = _in_flight_of(fleet.id)
        if moving is not None:
            raise _in_flight(moving)
        return RequestResult(
            RequestStatus.ALREADY_ACTIVE, None, False, view.route_revision, target.slug
        )

    for _attempt in range(3):
        try:
            op = _create(
                fleet_id=fleet.id,
                kind=kind,
                target=target,
                actor=actor,
                reason=reason,
                detected_at=detected_at,
                drill_mode=drill_mode,
            )
            return RequestResult(RequestStatus.ACCEPTED, op, True, view.route_revision, target.slug)
        except IntegrityError:
            existing = _in_flight_of(fleet.id)
            if existing is None:
                continue  # the in-flight one finished between our INSERT and this read
            # A drill joins only a drill of the same mode: a check never stands in for a round
            # trip, nor the other way round.
            same_mode = kind != OperationKind.DRILL or existing.drill_mode == drill_mode
            if existing.kind == kind and str(existing.target_domain_id) == target.id and same_mode:
                return RequestResult(
                    RequestStatus.ACCEPTED, existing, False, view.route_revision, target.slug
                )
            raise _in_flight(existing) from None
    raise OperationConflict("operation state kept changing; retry the request")


# Reasons an operation may run beside a rollout: the rollout's own promotion, and a failover
# (the active lost: failover comes first; the rollout pauses when it sees it).
_BESIDE_ROLLOUT = frozenset({"rollout", "auto_failover"})


def _refuse_beside_rollout(fleet: Fleet, kind: str, reason: str, active: DomainView | None) -> None:
    """A promotion, demotion or drill never runs beside a rollout, except its own promotion
    and a failover: an automatic one, or an operator's promotion away from a failed active."""
    if reason in _BESIDE_ROLLOUT:
        return
    if (
        kind == OperationKind.PROMOTE
        and active is not None
        and during_outage(kind=kind, detected_at=None, source_state=active.state)
    ):
        return
    rollout = (
        Rollout.objects.filter(fleet_id=fleet.id, state__in=IN_FLIGHT_ROLLOUT_STATES)
        .values("id", "model", "state")
        .first()
    )
    if rollout is not None:
        raise OperationConflict(
            f"no {kind} while rollout {rollout['id']} of {rollout['model']} is in flight "
            f"({rollout['state']}): pause or abort it first (a failover still runs)"
        )


def _in_flight_of(fleet_id: Id) -> Operation | None:
    return Operation.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES).first()


def _decide(
    view: FleetView, fleet: Fleet, kind: str, target_domain_id: str | None, drill_mode: str
) -> Decision:
    """The core's decision on the request: its target, or why not."""
    if kind != OperationKind.DRILL:
        decide = decide_promotion if kind == OperationKind.PROMOTE else decide_demotion
        return decide(view, str(target_domain_id))
    moving = _in_flight_of(fleet.id)
    if moving is not None and moving.kind != OperationKind.DRILL:
        # Said first and plainly: a drill never competes with a real operation.
        raise OperationConflict(
            f"no drill while an operation is in flight: {moving.kind} of domain "
            f"{moving.target_domain_slug} (operation {moving.id}, state {moving.state})",
            operation=moving,
        )
    ref = str(target_domain_id) if target_domain_id else None
    if drill_mode not in DrillMode.__members__.values():
        raise InvalidTarget(
            f"unknown drill mode {drill_mode!r}; one of {', '.join(m.value for m in DrillMode)}"
        )
    return decide_drill(view, ref, clock.now(), drill_mode)


def _create(
    *,
    fleet_id: Id,
    kind: str,
    target: DomainView,
    actor: str,
    reason: str,
    detected_at: datetime | None,
    drill_mode: str,
) -> Operation:
    """Insert the pending operation (IntegrityError: another holds the one in-flight place)."""
    with transaction.atomic():
        op = Operation.objects.create(
            fleet_id=fleet_id,
            kind=kind,
            target_domain_id=target.id,
            target_domain_slug=target.slug,
            state=OperationState.PENDING,
            current_step="",
            reason=reason,
            requested_by=actor,
            created_at=clock.now(),
            detected_at=detected_at,
            drill_mode=drill_mode if kind == OperationKind.DRILL else "",
        )
        # Capture the pointer now that our row holds the one in-flight place: no other
        # operation can move it from here on, so this source is exactly what we demote.
        # Its last good heartbeat is kept beside it: a failover's measured detection;
        # and its state: a promotion away from a failed active is a real failover.
        pointer = Fleet.objects.filter(pk=fleet_id).values("active_domain_id")[:1]
        source = Domain.objects.filter(pk=Subquery(pointer))
        Operation.objects.filter(pk=op.pk).update(
            source_domain_id=Subquery(pointer),
            source_seen_at=Subquery(source.values("last_seen_at")[:1]),
            source_state=Coalesce(Subquery(source.values("state")[:1]), Value("")),
        )
        op.refresh_from_db()
        # A healthy source's last good heartbeat may be kept on its fleet's tick lease, not on
        # its row (`fleets.reads.sightings`): the later of the two.
        kept = sightings_of([fleet_id]).get(str(op.source_domain_id))
        if kept is not None and (op.source_seen_at is None or kept > op.source_seen_at):
            Operation.objects.filter(pk=op.pk).update(source_seen_at=kept)
            op.source_seen_at = kept
        event_record(
            fleet_id=fleet_id,
            operation_id=op.id,
            domain_id=op.target_domain_id,
            kind=f"operation.requested.{kind}",
            actor=actor,
            data={
                "reason": reason,
                **({"drillMode": drill_mode} if kind == OperationKind.DRILL else {}),
                "targetDomainId": target.id,
                "sourceDomainId": str(op.source_domain_id or "") or None,
            },
        )
        _send_after_commit(operation_created, fleet_id=str(op.fleet_id), operation_id=str(op.id))
    return op


def _in_flight(existing: Operation) -> OperationConflict:
    return OperationConflict(
        f"{existing.kind} of domain {existing.target_domain_slug} is already in flight "
        f"(operation {existing.id}, state {existing.state})",
        operation=existing,
    )


def operation_start(*, operation_id: Id, actor: str = "reconciler") -> bool:
    """Move a pending operation to running at its first step."""
    op = Operation.objects.filter(pk=operation_id).values("kind", "fleet_id", "drill_mode").first()
    if op is None:
        return False
    first = steps_for(op["kind"], op["drill_mode"])[0]
    check_transition("operation", OperationState.PENDING, OperationState.RUNNING)
    now = clock.now()
    moved = guarded_update(
        Operation.objects.filter(pk=operation_id, state=OperationState.PENDING),
        {
            "state": OperationState.RUNNING,
            "current_step": first,
            "step_started_at": now,
            "started_at": now,
        },
        {
            "fleet_id": op["fleet_id"],
            "operation_id": operation_id,
            "kind": "operation.started",
            "actor": actor,
            "step": first,
        },
    )
    return bool(moved)


def operation_step_done(
    *,
    operation_id: Id,
    step: str,
    actor: str = "reconciler",
    outcome: str = "done",
    data: dict[str, Any] | None = None,
) -> bool:
    """Record `step` as finished and move to the next step, or succeed after the last one.

    Guarded by (running, current_step=step), so two ticks finishing the same step advance once.
    """
    op = (
        Operation.objects.filter(pk=operation_id)
        .values("kind", "drill_mode", "fleet_id", "step_started_at", "state", "current_step")
        .first()
    )
    if op is None or op["state"] != OperationState.RUNNING or op["current_step"] != step:
        return False
    steps = steps_for(op["kind"], op["drill_mode"])
    index = steps.index(step)
    now = clock.now()
    duration = (
        int((now - op["step_started_at"]).total_seconds() * 1000) if op["step_started_at"] else None
    )
    last = index == len(steps) - 1
    events: list[EventFields] = [
        {
            "fleet_id": op["fleet_id"],
            "operation_id": operation_id,
            "kind": "operation.step.done" if outcome == "done" else f"operation.step.{outcome}",
            "actor": actor,
            "step": step,
            "duration_ms": duration,
            "data": data,
        }
    ]
    values: dict[str, Any]
    if last:
        check_transition("operation", OperationState.RUNNING, OperationState.SUCCEEDED)
        values = {"state": OperationState.SUCCEEDED, "finished_at": now, "step_started_at": None}
        events.append(
            {
                "fleet_id": op["fleet_id"],
                "operation_id": operation_id,
                "kind": "operation.succeeded",
                "actor": actor,
            }
        )
    else:
        values = {"current_step": steps[index + 1], "step_started_at": now}
    moved = guarded_update(
        Operation.objects.filter(pk=operation_id, state=OperationState.RUNNING, current_step=step),
        values,
        *events,
    )
    return bool(moved)


def operation_fail(
    *,
    operation_id: Id,
    step: str,
    code: str,
    message: str,
    actor: str = "reconciler",
) -> bool:
    """Fail an in-flight operation and, in the same transaction, undo the target's half-moves.

    A promotion whose routing has committed is never failed here: the pointer already moved, so
    the guard `routing_committed=False` keeps an operation from reading "failed" while serving.
    Cleanup: the target's waking/probing slots go to failed (the next heartbeat mirrors their
    real posture) and training slots caught in stopping go back to training; the supervisor
    side of it (sleep, restart training) is recorded as a pending clean-up on the operation.
    """
    op = (
        Operation.objects.filter(pk=operation_id)
        .values("kind", "drill_mode", "fleet_id", "target_domain_id", "source_domain_id", "state")
        .first()
    )
    if op is None or op["state"] not in IN_FLIGHT_OPERATION_STATES:
        return False
    check_transition("operation", op["state"], OperationState.FAILED)
    now = clock.now()
    error = {"step": step, "code": code, "message": message}
    # A promotion or a drill may have woken its target: both leave a clean-up to restore
    # standby posture.
    promotion = op["kind"] in (OperationKind.PROMOTE, OperationKind.DRILL)
    moved = guarded_update(
        Operation.objects.filter(pk=operation_id, state=op["state"], routing_committed=False),
        {
            "state": OperationState.FAILED,
            "error": error,
            "finished_at": now,
            "cleanup": CleanupState.PENDING if promotion else CleanupState.NONE,
        },
        {
            "fleet_id": op["fleet_id"],
            "operation_id": operation_id,
            "domain_id": op["target_domain_id"],
            "kind": "operation.failed",
            "actor": actor,
            "step": step,
            "data": error,
        },
        then=lambda: _undo_half_moves(op, operation_id, actor),
    )
    return bool(moved)


def _undo_and_announce(op: Mapping[str, Any], operation_id: Id, actor: str) -> None:
    _undo_half_moves(op, operation_id, actor)
    _send_after_commit(operation_ended, fleet_id=str(op["fleet_id"]))


def _undo_half_moves(op: Mapping[str, Any], operation_id: Id, actor: str) -> None:
    """Put an ended promotion's or drill's target back (and a round trip's original active)."""
    if op["kind"] not in (OperationKind.PROMOTE, OperationKind.DRILL):
        return
    _undo_promotion_half_moves(op["target_domain_id"], operation_id, actor)
    if op["drill_mode"] == DrillMode.ROUND_TRIP and op["source_domain_id"]:
        # The second leg wakes the original active: its half-moves too.
        _undo_promotion_half_moves(op["source_domain_id"], operation_id, actor)


def _undo_promotion_half_moves(target_domain_id: Id, operation_id: Id, actor: str) -> None:
    for slot in Slot.objects.filter(domain_id=target_domain_id):
        # Waking or probing inference slots go to failed (the next heartbeat mirrors their real
        # posture); training caught in stopping goes back to training.
        if slot.kind == SlotKind.INFERENCE and slot.state in (
            InferenceState.WAKING,
            InferenceState.PROBING,
        ):
            to_state: str = InferenceState.FAILED
        elif slot.kind == SlotKind.TRAINING and slot.state == TrainingState.STOPPING:
            to_state = TrainingState.TRAINING
        else:
            continue
        slot_transition(
            slot_id=slot.id,
            to_state=to_state,
            from_states={slot.state},
            actor=actor,
            reason="promotion failed",
            operation_id=operation_id,
        )


# Why an operation was cancelled (the error code it ends with).
CANCELLED_BY_OPERATOR = OperationErrorCode.CANCELLED
# Message sizes are bounded: an operator's note or a reason never grows the row without limit.
_MAX_MESSAGE = 500


def operation_cancel(
    *,
    operation_id: Id,
    actor: str,
    message: str = "cancelled by operator",
    reason: str = CANCELLED_BY_OPERATOR,
) -> bool:
    """Cancel an in-flight operation that has not committed routing; False if it could not.

    One conditional UPDATE on (state, current step, routing not committed): a cancel that
    commits before the switch step keeps the pointer where it is (the switch's CAS requires a
    running operation), and a switch that commits first makes this refuse. A promotion's target
    is put back as a failed one is: half-moves undone here, the supervisor side left as a
    pending clean-up for the tick (never an external call inside this transaction).
    """
    for _attempt in range(3):
        op = (
            Operation.objects.filter(pk=operation_id)
            .values(
                "kind",
                "drill_mode",
                "fleet_id",
                "target_domain_id",
                "source_domain_id",
                "state",
                "current_step",
            )
            .first()
        )
        if op is None or op["state"] not in IN_FLIGHT_OPERATION_STATES:
            return False
        check_transition("operation", op["state"], OperationState.CANCELLED)
        # A promotion or a drill may have woken its target: both leave a clean-up to restore
        # standby posture.
        promotion = op["kind"] in (OperationKind.PROMOTE, OperationKind.DRILL)
        error = {"step": op["current_step"], "code": reason, "message": message[:_MAX_MESSAGE]}
        if guarded_update(
            Operation.objects.filter(
                pk=operation_id,
                state=op["state"],
                current_step=op["current_step"],
                routing_committed=False,
            ),
            {
                "state": OperationState.CANCELLED,
                "finished_at": clock.now(),
                "error": error,
                "cleanup": CleanupState.PENDING if promotion else CleanupState.NONE,
            },
            {
                "fleet_id": op["fleet_id"],
                "operation_id": operation_id,
                "domain_id": op["target_domain_id"],
                "kind": "operation.cancelled",
                "actor": actor,
                "step": op["current_step"] or "",
                "data": {"reason": reason, "message": error["message"]},
            },
            then=functools.partial(_undo_and_announce, op, operation_id, actor),
        ):
            return True
        still = Operation.objects.filter(pk=operation_id).values("state", "routing_committed")
        row = still.first()
        if row is None or row["state"] not in IN_FLIGHT_OPERATION_STATES:
            return False
        if row["routing_committed"]:
            return False
        # The step moved on between the read and the UPDATE: read again.
    return False


def operation_finish_early(
    *,
    operation_id: Id,
    actor: str,
    message: str = "cancelled by operator",
    reason: str = CANCELLED_BY_OPERATOR,
) -> tuple[str, ...]:
    """End a promotion whose routing committed without running its remaining best-effort steps.

    It did move routing, so it ends succeeded, never cancelled: each step it did not run is an
    `operation.step.skipped` event carrying `reason` (`cancelled` by an operator, `preempted` by
    a failover), and `operation.succeeded` lists them, so the timeline shows what was not done.
    One conditional UPDATE on (running, routing committed, the current step read, a best-effort
    one): a step that finishes first moves the current step and this reads again; a step
    executor that finishes after changes nothing (its guard is on state and current step). The
    old active's posture is then the failover's or the restore-standby pass's, as after a
    best-effort timeout. Return the steps skipped; empty when it could not end (finished, not
    committed, or committed a moment ago with its switch not recorded yet).
    """
    note = message[:_MAX_MESSAGE]
    for _attempt in range(3):
        row = Operation.objects.filter(pk=operation_id).values(*_FINISH_EARLY_READS).first()
        if row is None or row["state"] != OperationState.RUNNING:
            return ()
        current = InFlight(
            kind=row["kind"],
            target_id=None,
            routing_committed=row["routing_committed"],
            current_step=row["current_step"],
            drill_mode=row["drill_mode"],
        )
        if ending(current) != Ending.SKIP_REST:
            return ()
        skipped = steps_left(current)
        ended = _skip_rest(
            row, skipped, operation_id=operation_id, actor=actor, note=note, reason=reason
        )
        if ended:
            return skipped
        # The step moved on (or the operation finished) between the read and the UPDATE.
    return ()


_FINISH_EARLY_READS = (
    "kind",
    "drill_mode",
    "fleet_id",
    "source_domain_id",
    "state",
    "current_step",
    "routing_committed",
    "step_started_at",
)


def _skip_rest(
    row: dict[str, Any],
    skipped: tuple[str, ...],
    *,
    operation_id: Id,
    actor: str,
    note: str,
    reason: str,
) -> bool:
    """End the operation succeeded with `skipped` on record; False if its step moved on."""
    check_transition("operation", OperationState.RUNNING, OperationState.SUCCEEDED)
    now = clock.now()
    started = row["step_started_at"]
    ran_ms = int((now - started).total_seconds() * 1000) if started else None
    events: list[EventFields] = [
        {
            "fleet_id": row["fleet_id"],
            "operation_id": operation_id,
            # Every best-effort step acts on the old active.
            "domain_id": row["source_domain_id"],
            "kind": "operation.step.skipped",
            "actor": actor,
            "step": step,
            # How long the step it interrupted had run; the later ones never began.
            "duration_ms": ran_ms if index == 0 else None,
            "data": {"reason": reason, "message": note},
        }
        for index, step in enumerate(skipped)
    ]
    events.append(
        {
            "fleet_id": row["fleet_id"],
            "operation_id": operation_id,
            "kind": "operation.succeeded",
            "actor": actor,
            "data": {"skippedSteps": list(skipped), "reason": reason},
        }
    )
    moved = guarded_update(
        Operation.objects.filter(
            pk=operation_id,
            state=OperationState.RUNNING,
            routing_committed=True,
            current_step=row["current_step"],
        ),
        {"state": OperationState.SUCCEEDED, "finished_at": now, "step_started_at": None},
        *events,
        then=lambda: _send_after_commit(operation_ended, fleet_id=str(row["fleet_id"])),
    )
    return bool(moved)


@dataclass(frozen=True)
class CancelOutcome:
    """What an operator's cancel did.

    `status` "cancelled": the operation ended cancelled (nothing had committed). "succeeded": a
    promotion that had already moved routing ended without its remaining best-effort steps,
    listed in `skipped_steps`.
    """

    status: str
    operation: Operation
    skipped_steps: tuple[str, ...] = ()


def operation_cancel_request(*, fleet_id: Id, operation_id: str, actor: str) -> CancelOutcome:
    """Cancel an operation of `fleet_id` for an operator (API, dashboard, admin).

    An operation that has not committed routing is cancelled. A promotion that already moved
    routing cannot be un-moved: its remaining best-effort steps on the old active are skipped
    and it ends succeeded (`operation_finish_early`). Raises OperationNotFound when the
    operation is not this fleet's, OperationNotCancellable (409) when it already finished
    (`operation_finished`) or moved routing a moment ago and is still recording its switch
    (`routing_committed`: retry).
    """
    op = _fleet_operation(fleet_id, operation_id)
    if operation_cancel(operation_id=op.id, actor=actor):
        op.refresh_from_db()
        return CancelOutcome(OperationState.CANCELLED.value, op)
    skipped = operation_finish_early(
        operation_id=op.id,
        actor=actor,
        message="cancelled by operator after routing moved: its remaining best-effort steps "
        "on the old active are not run",
    )
    op.refresh_from_db()
    if skipped:
        return CancelOutcome(OperationState.SUCCEEDED.value, op, skipped)
    if op.state not in IN_FLIGHT_OPERATION_STATES:
        raise OperationNotCancellable(
            f"{op.kind} {op.id} already finished ({op.state})", operation=op
        )
    if op.routing_committed:
        raise OperationNotCancellable(
            f"{op.kind} {op.id} has just moved routing and is recording its switch "
            f"(step {op.current_step}); retry the cancel",
            code=ErrorCode.ROUTING_COMMITTED,
            operation=op,
        )
    raise OperationConflict(f"{op.kind} {op.id} kept changing; retry the cancel", operation=op)


def _fleet_operation(fleet_id: Id, operation_id: str) -> Operation:
    try:
        as_id = uuid.UUID(str(operation_id))
    except ValueError:
        as_id = None
    op = (
        Operation.objects.filter(pk=as_id, fleet_id=fleet_id)
        .select_related("fleet", "target_domain", "source_domain")
        .first()
        if as_id is not None
        else None
    )
    if op is None:
        raise OperationNotFound(f"operation {operation_id!r} not found in this fleet")
    return op


# -- the clean-up after a failed or cancelled promotion ------------------------------------------


def operation_cleanup_claim(*, operation_id: Id, lease_ms: int) -> bool:
    """Take the pending clean-up for `lease_ms`; False while another tick holds it.

    The lease, not a flag, because the holder may die: the next tick after the lease ends takes
    over, and the clean-up's steps are check-and-nudge, so a second run does no harm.
    """
    now = clock.now()
    return bool(
        Operation.objects.filter(pk=operation_id, cleanup=CleanupState.PENDING)
        .filter(Q(cleanup_lease_until__isnull=True) | Q(cleanup_lease_until__lte=now))
        .update(cleanup_lease_until=now + timedelta(milliseconds=lease_ms))
    )


def operation_cleanup_finish(
    *,
    operation_id: Id,
    outcome: CleanupState,
    actor: str = "reconciler",
    data: dict[str, Any] | None = None,
) -> bool:
    """Record the clean-up's outcome, once: the first finisher wins, a late one changes nothing."""
    if outcome in (CleanupState.NONE, CleanupState.PENDING):
        raise ValueError(f"a clean-up cannot finish as {outcome!r}")
    row = Operation.objects.filter(pk=operation_id).values("fleet_id", "target_domain_id").first()
    if row is None:
        return False
    moved = guarded_update(
        Operation.objects.filter(pk=operation_id, cleanup=CleanupState.PENDING),
        {"cleanup": outcome, "cleanup_lease_until": None},
        {
            "fleet_id": row["fleet_id"],
            "operation_id": operation_id,
            "domain_id": row["target_domain_id"],
            "kind": "operation.cleanup.finished",
            "actor": actor,
            "data": {"outcome": str(outcome), **(data or {})},
        },
    )
    return bool(moved)
