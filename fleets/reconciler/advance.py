"""Advance a fleet's in-flight operation through every step that completes at once.

Unlike one nudge per tick, a tick keeps going while steps finish (a no-op verify, an instant
CAS), and re-polls a step that waits on the outside world for a short while before handing
back with "look again in N ms". Every move is a guarded service call, so two ticks advancing
the same operation at once record each step once: the loser's CAS simply does not match.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleets.base import clock
from fleets.core.policy import Policy
from fleets.core.states import (
    BEST_EFFORT_STEPS,
    IN_FLIGHT_OPERATION_STATES,
    DomainState,
    OperationKind,
    OperationState,
    Step,
    leg_step,
    on_leg_of,
)
from fleets.models import Domain, Event, Id, Operation
from fleets.reads.recovery import operation_failover_ms
from fleets.reconciler.steps import demote, drill, promote
from fleets.reconciler.steps.base import (
    STEP_TIMEOUT,
    SWITCH_QUIET_MS,
    Executor,
    StepContext,
    StepResult,
)
from fleets.reconciler.steps.cleanup import cleanup_run
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.services.events import event_record
from fleets.services.operations import operation_fail, operation_start, operation_step_done
from fleets.services.transitions import domain_transition

log = logging.getLogger(__name__)

# The clean-up right after a failure, by name so a test can skip it as a dying worker would.
cleanup_after_failure = cleanup_run

EXECUTORS: dict[str, Mapping[str, Executor]] = {
    OperationKind.PROMOTE: promote.EXECUTORS,
    OperationKind.DEMOTE: demote.EXECUTORS,
    OperationKind.DRILL: drill.EXECUTORS,
}
# A runaway guard: fourteen round-trip drill steps, each recorded once, plus a start.
_MAX_MOVES = 32


@dataclass(frozen=True)
class Advance:
    """What the tick did to the fleet's operation.

    `operation_id`: the operation it touched (None when none was in flight). `nudge_ms`: look
    again this soon, because a step waits on the outside world; None when nothing waits.
    """

    operation_id: Id | None
    nudge_ms: int | None


def operation_advance(
    *,
    fleet_id: Id,
    client_for: Callable[[Domain], SupervisorClient],
    budget_s: float,
    poll_s: float,
    actor: str = "reconciler",
    checkpoint: Callable[[], None] | None = None,
) -> Advance:
    """Run the in-flight operation's steps until one waits, the operation ends, or time is up.

    `budget_s` bounds starting new nudges; `poll_s` bounds how long a waiting step is re-polled
    inside this call before handing back with a nudge (0: hand back at once, as unit tests do).
    `checkpoint` runs before every step (the tick's lease check).
    """
    started = time.monotonic()
    touched = None
    for _ in range(_MAX_MOVES):
        if checkpoint is not None:
            checkpoint()  # the tick's lease: renewed here, or LeaseLost before any other write
        op = (
            Operation.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES)
            .select_related("fleet", "target_domain", "source_domain")
            .first()
        )
        if op is None:
            return Advance(touched, None)
        touched = op.id
        if op.state == OperationState.PENDING:
            operation_start(operation_id=op.id, actor=actor)
            continue
        elapsed = time.monotonic() - started
        if elapsed > budget_s:
            return Advance(op.id, 0)
        policy = Policy.resolve(op.fleet.policy)
        ctx = StepContext(
            operation=op, policy=policy, step=op.current_step, client_for=client_for, actor=actor
        )
        result = EXECUTORS[op.kind][op.current_step](ctx)
        if result.done:
            _record_done(ctx, result, actor)
            if _moved_routing(ctx, result):
                # The burst the commit released has this host first (SWITCH_QUIET_MS), within
                # what this call may wait at all.
                quiet_s = min(SWITCH_QUIET_MS / 1000, poll_s - (time.monotonic() - started))
                if quiet_s > 0:
                    clock.get_clock().sleep(quiet_s)
            continue
        if checkpoint is not None:
            # A wait, a failure or a timeout seen after this process began to stop may be the
            # stop itself (its hosts stopping with it): leave the step to resume, unjudged.
            checkpoint()
        if result.failed:
            _fail(ctx, result.code, result.message)
            return Advance(op.id, None)
        if ctx.expired():
            _timeout(ctx, result)
            continue
        if result.trouble:
            _record_retry(ctx, result, actor)
        wait_s = result.retry_ms / 1000
        if time.monotonic() - started + wait_s <= poll_s:
            time.sleep(wait_s)
            continue
        return Advance(op.id, result.retry_ms)
    return Advance(touched, 0)


def _moved_routing(ctx: StepContext, result: StepResult) -> bool:
    """Whether the step that just ended moved the routing pointer (a switch on either leg that
    found the pointer elsewhere)."""
    return (
        ctx.step == on_leg_of(Step.SWITCH_ROUTE, ctx.step)
        and result.outcome == "done"
        and not result.data.get("alreadyActive")
    )


def _record_done(ctx: StepContext, result: StepResult, actor: str) -> None:
    # The step's event carries its duration, and the failover time below: the metrics are
    # rebuilt from those rows at scrape time (fleets.metrics.history).
    op, step = ctx.operation, ctx.step
    data = dict(result.data)
    if step == Step.SWITCH_ROUTE:
        # The failover figure (fleets/core/outage.py): from the outage's start to the routing
        # commit as the compare-and-swap recorded it (served_at), not to this record a moment
        # later; also when the commit was ours but its record was lost (alreadyActive).
        committed = Operation.objects.filter(pk=op.id).first()
        figure = operation_failover_ms(committed) if committed is not None else None
        if figure is not None:
            data["failoverMs"] = figure
    operation_step_done(
        operation_id=op.id, step=step, actor=actor, outcome=result.outcome, data=data
    )


def _record_retry(ctx: StepContext, result: StepResult, actor: str) -> None:
    """Record one failed attempt of a step that will be tried again (the dashboard shows it)."""
    op, step = ctx.operation, ctx.step
    attempt = (
        Event.objects.filter(operation_id=op.id, kind="operation.step.retry", step=step).count() + 1
    )
    event_record(
        fleet_id=op.fleet_id,
        operation_id=op.id,
        domain_id=_acted_on(op, step),
        kind="operation.step.retry",
        step=step,
        actor=actor,
        data={"attempt": attempt, "message": result.message[:500], "retryMs": result.retry_ms},
    )


def _acted_on(op: Operation, step: str) -> Id | None:
    """The domain a step acts on: the old active for the demotion steps, else the target; a
    round-trip drill's second leg (`back_*`) swaps the two."""
    leg = leg_step(step)
    on_source = (leg in BEST_EFFORT_STEPS) != (leg != step)
    return op.source_domain_id if on_source else op.target_domain_id


def _timeout(ctx: StepContext, result: StepResult) -> None:
    op, step, actor = ctx.operation, ctx.step, ctx.actor
    budget = ctx.budget_ms
    message = f"{step} did not finish within {budget} ms: {result.message}"
    # A round-trip drill's demotion of the original active is what it set out to prove: its
    # timeout fails the drill, and the clean-up routes back if the original still serves.
    if step in BEST_EFFORT_STEPS and op.kind != OperationKind.DRILL:
        # The old active may be dead: advance anyway, and mark it degraded so nobody mistakes it
        # for a healthy standby until a heartbeat proves it.
        if (
            operation_step_done(
                operation_id=op.id,
                step=step,
                actor=actor,
                outcome="timeout_best_effort",
                data={"message": message},
            )
            and op.source_domain_id is not None
        ):
            domain_transition(
                domain_id=op.source_domain_id,
                to_state=DomainState.DEGRADED,
                from_states={DomainState.READY},
                actor=actor,
                reason=message,
                operation_id=op.id,
            )
        return
    _fail(ctx, STEP_TIMEOUT, message)


def _fail(ctx: StepContext, code: str, message: str) -> None:
    op, step, actor = ctx.operation, ctx.step, ctx.actor
    if not operation_fail(operation_id=op.id, step=step, code=code, message=message, actor=actor):
        return
    log.warning("operation %s failed at %s: %s: %s", op.id, step, code, message)
    if op.kind in (OperationKind.PROMOTE, OperationKind.DRILL):
        # operation_fail has committed the clean-up as pending; the supervisor calls run here,
        # outside any transaction, and the next tick finishes them if this worker dies first.
        cleanup_after_failure(
            operation=op, policy=ctx.policy, client_for=ctx.client_for, actor=actor
        )
    if op.kind == OperationKind.DRILL:
        drill.alert_failed(operation=op, step=step, code=code, message=message, actor=actor)
