"""Operations: request (create or join), start, advance a step, succeed, fail.

Creation is race-free through the partial unique constraint "one pending/running operation per
fleet": the INSERT either wins, or loses to the in-flight row, which the request then joins (same
kind and target) or reports as a conflict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Subquery

from fleets import clock
from fleets.core.decisions import decide_demotion, decide_promotion
from fleets.core.drills import decide_drill
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    InferenceState,
    OperationKind,
    OperationState,
    SlotKind,
    TrainingState,
    check_transition,
    steps_for,
)
from fleets.errors import InvalidTarget, OperationConflict
from fleets.models import Fleet, Id, Operation, Slot
from fleets.selectors import fleet_view
from fleets.services.events import event_record
from fleets.services.transitions import slot_transition

# Called (after commit) with the operation id whenever an operation is created, so the
# reconciler can start it at once instead of at the next beat. The reconciler registers here.
on_operation_created: list[Callable[[str, str], None]] = []


@dataclass(frozen=True)
class RequestResult:
    status: str  # "already_active" or "accepted"
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
) -> RequestResult:
    """Create a promote/demote/drill operation, or join the in-flight one with the same kind
    and target.

    `target_domain_id` is a domain id or slug (None for a drill: the standby a failover would
    take); the core's decision resolves it, once. Raises
    InvalidTarget when the core refuses the target and OperationConflict when another operation
    is in flight.
    """
    view = fleet_view(fleet)
    if kind == OperationKind.DRILL:
        moving = Operation.objects.filter(
            fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
        ).first()
        if moving is not None and moving.kind != OperationKind.DRILL:
            # Said first and plainly: a drill never competes with a real operation.
            raise OperationConflict(
                f"no drill while an operation is in flight: {moving.kind} of domain "
                f"{moving.target_domain_slug} (operation {moving.id}, state {moving.state})",
                operation=moving,
            )
        ref = str(target_domain_id) if target_domain_id else None
        decision = decide_drill(view, ref, clock.now())
    else:
        decide = decide_promotion if kind == OperationKind.PROMOTE else decide_demotion
        decision = decide(view, str(target_domain_id))
    if decision.outcome == "reject" or decision.target is None:
        raise InvalidTarget(decision.message)
    target = decision.target
    if decision.outcome == "noop":
        # "Already there" is only true if nothing is moving the fleet away from there: while
        # another operation is in flight the answer is that operation, as for any request.
        moving = Operation.objects.filter(
            fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
        ).first()
        if moving is not None:
            raise _in_flight(moving)
        return RequestResult("already_active", None, False, view.route_revision, target.slug)

    for _attempt in range(3):
        try:
            with transaction.atomic():
                op = Operation.objects.create(
                    fleet_id=fleet.id,
                    kind=kind,
                    target_domain_id=target.id,
                    target_domain_slug=target.slug,
                    state=OperationState.PENDING,
                    current_step="",
                    reason=reason,
                    requested_by=actor,
                    created_at=clock.now(),
                    detected_at=detected_at,
                )
                # Capture the pointer now that our row holds the one in-flight place: no other
                # operation can move it from here on, so this source is exactly what we demote.
                Operation.objects.filter(pk=op.pk).update(
                    source_domain_id=Subquery(
                        Fleet.objects.filter(pk=fleet.id).values("active_domain_id")[:1]
                    )
                )
                op.refresh_from_db()
                event_record(
                    fleet_id=fleet.id,
                    operation_id=op.id,
                    domain_id=op.target_domain_id,
                    kind=f"operation.requested.{kind}",
                    actor=actor,
                    data={
                        "reason": reason,
                        "targetDomainId": target.id,
                        "sourceDomainId": str(op.source_domain_id or "") or None,
                    },
                )
                for hook in on_operation_created:
                    transaction.on_commit(functools.partial(hook, str(op.fleet_id), str(op.id)))
            return RequestResult("accepted", op, True, view.route_revision, target.slug)
        except IntegrityError:
            existing = Operation.objects.filter(
                fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
            ).first()
            if existing is None:
                continue  # the in-flight one finished between our INSERT and this read
            if existing.kind == kind and str(existing.target_domain_id) == target.id:
                return RequestResult("accepted", existing, False, view.route_revision, target.slug)
            raise _in_flight(existing) from None
    raise OperationConflict("operation state kept changing; retry the request")


def _in_flight(existing: Operation) -> OperationConflict:
    return OperationConflict(
        f"{existing.kind} of domain {existing.target_domain_slug} is already in flight "
        f"(operation {existing.id}, state {existing.state})",
        operation=existing,
    )


def operation_start(*, operation_id: Id, actor: str = "reconciler") -> bool:
    """Move a pending operation to running at its first step."""
    op = Operation.objects.filter(pk=operation_id).values("kind", "fleet_id").first()
    if op is None:
        return False
    check_transition("operation", OperationState.PENDING, OperationState.RUNNING)
    now = clock.now()
    with transaction.atomic():
        moved = Operation.objects.filter(pk=operation_id, state=OperationState.PENDING).update(
            state=OperationState.RUNNING,
            current_step=steps_for(op["kind"])[0],
            step_started_at=now,
            started_at=now,
        )
        if moved:
            event_record(
                fleet_id=op["fleet_id"],
                operation_id=operation_id,
                kind="operation.started",
                actor=actor,
                step=steps_for(op["kind"])[0],
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
        .values("kind", "fleet_id", "step_started_at", "state", "current_step")
        .first()
    )
    if op is None or op["state"] != OperationState.RUNNING or op["current_step"] != step:
        return False
    steps = steps_for(op["kind"])
    index = steps.index(step)
    now = clock.now()
    duration = (
        int((now - op["step_started_at"]).total_seconds() * 1000) if op["step_started_at"] else None
    )
    last = index == len(steps) - 1
    with transaction.atomic():
        guard = Operation.objects.filter(
            pk=operation_id, state=OperationState.RUNNING, current_step=step
        )
        if last:
            check_transition("operation", OperationState.RUNNING, OperationState.SUCCEEDED)
            moved = guard.update(
                state=OperationState.SUCCEEDED, finished_at=now, step_started_at=None
            )
        else:
            moved = guard.update(current_step=steps[index + 1], step_started_at=now)
        if moved:
            event_record(
                fleet_id=op["fleet_id"],
                operation_id=operation_id,
                kind=("operation.step.done" if outcome == "done" else f"operation.step.{outcome}"),
                actor=actor,
                step=step,
                duration_ms=duration,
                data=data,
            )
            if last:
                event_record(
                    fleet_id=op["fleet_id"],
                    operation_id=operation_id,
                    kind="operation.succeeded",
                    actor=actor,
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
    real posture) and training slots caught in stopping go back to training.
    """
    op = (
        Operation.objects.filter(pk=operation_id)
        .values("kind", "fleet_id", "target_domain_id", "state", "step_started_at")
        .first()
    )
    if op is None or op["state"] not in IN_FLIGHT_OPERATION_STATES:
        return False
    check_transition("operation", op["state"], OperationState.FAILED)
    now = clock.now()
    error = {"step": step, "code": code, "message": message}
    with transaction.atomic():
        moved = Operation.objects.filter(
            pk=operation_id,
            state=op["state"],
            routing_committed=False,
        ).update(state=OperationState.FAILED, error=error, finished_at=now)
        if not moved:
            return False
        event_record(
            fleet_id=op["fleet_id"],
            operation_id=operation_id,
            domain_id=op["target_domain_id"],
            kind="operation.failed",
            actor=actor,
            step=step,
            data=error,
        )
        if op["kind"] in (OperationKind.PROMOTE, OperationKind.DRILL):
            _undo_promotion_half_moves(op["target_domain_id"], operation_id, actor)
    return True


def _undo_promotion_half_moves(target_domain_id: Id, operation_id: Id, actor: str) -> None:
    target_slots = Slot.objects.filter(domain_id=target_domain_id)
    for slot in target_slots:
        if slot.kind == SlotKind.INFERENCE and slot.state in (
            InferenceState.WAKING,
            InferenceState.PROBING,
        ):
            slot_transition(
                slot_id=slot.id,
                to_state=InferenceState.FAILED,
                from_states={slot.state},
                actor=actor,
                reason="promotion failed",
                operation_id=operation_id,
            )
        elif slot.kind == SlotKind.TRAINING and slot.state == TrainingState.STOPPING:
            slot_transition(
                slot_id=slot.id,
                to_state=TrainingState.TRAINING,
                from_states={TrainingState.STOPPING},
                actor=actor,
                reason="promotion failed",
                operation_id=operation_id,
            )


def operation_cancel(
    *, operation_id: Id, actor: str, message: str = "cancelled by operator"
) -> bool:
    """Cancel an in-flight operation that has not committed routing."""
    op = Operation.objects.filter(pk=operation_id).values("fleet_id", "state").first()
    if op is None or op["state"] not in IN_FLIGHT_OPERATION_STATES:
        return False
    check_transition("operation", op["state"], OperationState.CANCELLED)
    with transaction.atomic():
        moved = Operation.objects.filter(
            pk=operation_id,
            state=op["state"],
            routing_committed=False,
        ).update(
            state=OperationState.CANCELLED,
            finished_at=clock.now(),
            error={"step": "", "code": "cancelled", "message": message},
        )
        if moved:
            event_record(
                fleet_id=op["fleet_id"],
                operation_id=operation_id,
                kind="operation.cancelled",
                actor=actor,
            )
    return bool(moved)
