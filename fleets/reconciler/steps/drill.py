"""The drill's step executors (fleets.core.states.DRILL_STEPS, ROUND_TRIP_DRILL_STEPS), and its
failure alert.

Every step is the promotion's or the demotion's own: a check drill proves exactly the path a
failover would take, up to the golden probe, and then walks the standby back into posture with
the demotion's steps; routing is never touched. A round-trip drill runs the promotion's steps to
the standby, then the same executors again (`back_*`) with target and source swapped, so the
second leg promotes the original active and demotes the standby.
"""

from __future__ import annotations

import copy

from fleets.core.states import BACK_LEG, PROMOTE_STEPS, Step
from fleets.models import Operation
from fleets.reconciler.steps import demote, promote
from fleets.reconciler.steps.base import SOURCE_GONE, Executor, StepContext, StepResult, failed
from fleets.services.events import event_record


def back_leg(operation: Operation) -> Operation:
    """The operation as the second leg sees it: the original active is the target and the
    drilled standby the domain demoted. An in-memory copy: executors never save it."""
    original, standby = operation.source_domain, operation.target_domain
    swapped = copy.copy(operation)
    swapped.target_domain = original
    swapped.source_domain = standby
    swapped.target_domain_slug = original.slug if original is not None else ""
    return swapped


def _on_back_leg(executor: Executor) -> Executor:
    def run(ctx: StepContext) -> StepResult:
        if ctx.operation.source_domain is None:
            # Nothing to promote back to: the drill cannot finish its round trip.
            return failed(SOURCE_GONE, "the original active domain is gone; cannot promote back")
        swapped = StepContext(
            operation=back_leg(ctx.operation),
            policy=ctx.policy,
            step=ctx.step,
            client_for=ctx.client_for,
            actor=ctx.actor,
        )
        return executor(swapped)

    return run


EXECUTORS: dict[str, Executor] = {
    # A check drill: the promotion's steps up to the probe, then the demotion's.
    **promote.EXECUTORS,
    **demote.EXECUTORS,
    # A round trip's first leg is the promotion to the standby (routing moves, the original
    # active is demoted); its second leg: the same, back to the original active.
    **{Step(BACK_LEG + step): _on_back_leg(promote.EXECUTORS[step]) for step in PROMOTE_STEPS},
}


def alert_failed(*, operation: Operation, step: str, code: str, message: str, actor: str) -> None:
    """Raise the alarm for a failed drill: the standby would not have taken over.

    The event feeds the dashboard's red mark and the `haru_drill_last_passed` gauge reads the
    operation; standby posture is already being restored by the failure clean-up.
    """
    event_record(
        fleet_id=operation.fleet_id,
        domain_id=operation.target_domain_id,
        operation_id=operation.id,
        kind="drill.failed",
        actor=actor,
        step=step,
        data={"code": code, "message": message[:500], "domain": operation.target_slug},
    )
