"""The demotion's step executors (fleets.core.states.DEMOTE_STEPS): sleep, then start training.

A demotion acts on a standby, so both steps refuse (`target_is_active`) if the target became
the active domain meanwhile: sleeping the domain that serves traffic is an outage.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fleets.core.states import Step
from fleets.models import Fleet
from fleets.reconciler.steps import posture
from fleets.reconciler.steps.base import (
    NO_SUPERVISOR,
    SUPERVISOR_UNAUTHORIZED,
    TARGET_IS_ACTIVE,
    Executor,
    StepContext,
    StepResult,
    done,
    failed,
    pending,
)


def _refusal(ctx: StepContext) -> StepResult | None:
    active = (
        Fleet.objects.filter(pk=ctx.operation.fleet_id)
        .values_list("active_domain_id", flat=True)
        .first()
    )
    if active == ctx.operation.target_domain_id:
        return failed(TARGET_IS_ACTIVE, f"domain {ctx.target.slug} is the active domain")
    if not ctx.target.supervisor_url:
        return failed(NO_SUPERVISOR, f"domain {ctx.target.slug} has no supervisor URL")
    return None


def _answer(ctx: StepContext, result: posture.Posture) -> StepResult:
    if result.reached:
        return done(**result.data)
    if result.call is not None and result.call.unauthorized:
        # A wrong token on the target: waiting cannot fix it.
        return failed(SUPERVISOR_UNAUTHORIZED, result.message)
    return pending(result.message)


def _reach(ctx: StepContext, ensure: Callable[..., posture.Posture]) -> StepResult:
    """Bring the target to a posture (`ensure`), unless the step is refused."""
    refusal = _refusal(ctx)
    if refusal is not None:
        return refusal
    target = posture.Target(ctx.client_for(ctx.target), ctx.target, ctx.slot_move)
    result = ensure(target, ctx.call_timeout)
    return _answer(ctx, result)


def sleep(ctx: StepContext) -> StepResult:
    """Put every bound model of the standby to sleep, proven by the supervisor."""
    return _reach(ctx, partial(posture.ensure_asleep, budget=ctx.remaining_s))


def start_training(ctx: StepContext) -> StepResult:
    """Start training on every training slot; done when each runs with a PID."""
    return _reach(ctx, posture.ensure_training)


EXECUTORS: dict[str, Executor] = {Step.SLEEP: sleep, Step.START_TRAINING: start_training}
