"""Run a dashboard action through the same services as the API, and say what happened.

Each function returns an `ActionResult` the view renders as a flash message (or JSON for the
page's script); service errors (conflict, invalid target) carry the API's code and message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from fleets.base.errors import ErrorCode, ServiceError
from fleets.core.decisions import RequestStatus
from fleets.core.policy import Policy
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    DrillMode,
    OperationKind,
    OperationState,
)
from fleets.models import Fleet, Rollout
from fleets.reads.selectors import domain_get, domain_or_active
from fleets.reconciler.golden import record_baselines
from fleets.reconciler.supervisor.client import client_for
from fleets.reconciler.tick import fleet_reconcile
from fleets.services.operations import operation_cancel_request, operation_request
from fleets.services.provisioning import domain_provision_begin, domain_stop_request
from fleets.services.rollouts import (
    rollout_abort,
    rollout_pause,
    rollout_promote_early,
    rollout_resume,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    status: int  # the HTTP status the API would answer
    code: str
    message: str
    operation_id: str | None = None


def request_operation(*, fleet: Fleet, kind: str, target: str, actor: str) -> ActionResult:
    """Request a promote or demote of `target` (slug or id), exactly as the API does."""
    try:
        result = operation_request(fleet=fleet, kind=kind, target_domain_id=target, actor=actor)
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    if result.status == RequestStatus.ALREADY_ACTIVE:
        return ActionResult(
            True,
            200,
            RequestStatus.ALREADY_ACTIVE,
            f"{result.target_slug} is already active (route revision {result.route_revision})",
        )
    op = result.operation
    verb = "promotion" if kind == OperationKind.PROMOTE else "demotion"
    how = "started" if result.created else "already in flight; joined"
    op_id = str(op.id) if op is not None else ""
    return ActionResult(
        True,
        202,
        RequestStatus.ACCEPTED,
        f"{verb} of {result.target_slug} {how} (operation {op_id[:8]})",
        op_id or None,
    )


def cancel_operation(*, fleet: Fleet, operation_id: str, actor: str) -> ActionResult:
    """Cancel an in-flight operation of the fleet, exactly as the API does."""
    try:
        outcome = operation_cancel_request(
            fleet_id=fleet.id, operation_id=operation_id, actor=actor
        )
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    op = outcome.operation
    if outcome.skipped_steps:
        # Routing had moved: the promotion succeeded, only its steps on the old active are off.
        return ActionResult(
            True,
            200,
            OperationState.SUCCEEDED,
            f"{op.kind} of {op.target_slug} had already moved routing: it ends succeeded "
            f"without {', '.join(outcome.skipped_steps)} (operation {str(op.id)[:8]}); the old "
            "active's standby posture is left to the restore-standby pass",
            str(op.id),
        )
    tail = (
        "; its target goes back to standby posture at the next tick"
        if op.kind == OperationKind.PROMOTE
        else ""
    )
    return ActionResult(
        True,
        200,
        OperationState.CANCELLED,
        f"{op.kind} of {op.target_slug} cancelled (operation {str(op.id)[:8]}){tail}",
        str(op.id),
    )


def reconcile_now(*, fleet: Fleet, actor: str) -> ActionResult:
    """Run one reconcile tick for the fleet now (heartbeats, failover detection, steps)."""
    # The same call as the API's POST .../reconcile.

    try:
        result = fleet_reconcile(fleet_id=fleet.id, actor=actor)
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    except Exception:  # noqa: BLE001 - show the operator a clean error; the log has the trace
        log.exception("reconcile of fleet %s requested by %s failed", fleet.slug, actor)
        return ActionResult(
            False, 500, ErrorCode.INTERNAL_ERROR, "reconcile failed; see the server log"
        )
    op = result.operation()
    tail = ""
    if op is not None:
        in_flight = op.state in IN_FLIGHT_OPERATION_STATES
        where = (op.current_step or "not started") if in_flight else op.state
        tail = f"; {op.kind} of {op.target_slug}: {where}"
    how = "reconciled" if result.ran else "a tick was already running; it will pick this up"
    return ActionResult(True, 200, "reconciled", f"{fleet.slug}: {how}{tail}")


def provision_move(*, fleet: Fleet, action: str, target: str, actor: str) -> ActionResult:
    """Provision (from failed or stopped) or stop a Haru-provisioned domain, as the API does;
    the provisioning pass does the cloud work afterwards."""
    try:
        domain = domain_get(fleet, target)
        if action == "provision":
            moved = domain_provision_begin(domain_id=domain.id, actor=actor, reason="manual")
            done = f"{domain.slug} is provisioning; the cluster is launched next"
        else:
            moved = domain_stop_request(domain_id=domain.id, actor=actor)
            done = f"{domain.slug} is stopping; its cluster is torn down next"
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    if not moved:
        return ActionResult(True, 200, RequestStatus.UNCHANGED, f"{domain.slug}: nothing to do")
    return ActionResult(True, 202, RequestStatus.ACCEPTED, done)


def request_drill(
    *, fleet: Fleet, target: str | None, actor: str, mode: str = DrillMode.CHECK
) -> ActionResult:
    """Request a drill of `target` (default: the standby a failover would take) in `mode`."""
    try:
        result = operation_request(
            fleet=fleet,
            kind=OperationKind.DRILL,
            target_domain_id=target,
            actor=actor,
            reason="manual_drill",
            drill_mode=mode,
        )
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    op_id = str(result.operation.id) if result.operation is not None else ""
    how = "started" if result.created else "already in flight; joined"
    return ActionResult(
        True,
        202,
        RequestStatus.ACCEPTED,
        f"{mode} drill of {result.target_slug} {how} (operation {op_id[:8]})",
        op_id or None,
    )


def record_baseline(*, fleet: Fleet, target: str | None, actor: str) -> ActionResult:
    """Record the golden baselines from `target` (default: the active), as the API does."""
    try:
        domain = domain_or_active(fleet, target)
        done = record_baselines(
            domain=domain,
            policy=Policy.resolve(fleet.policy),
            actor=actor,
            client_for=client_for,
        )
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    recorded = ", ".join(done.recorded) or "nothing new"
    return ActionResult(True, 200, "recorded", f"baselines from {domain.slug}: {recorded}")


_ROLLOUT_MOVES: dict[str, tuple[Callable[..., Rollout], str]] = {
    "rollout-pause": (rollout_pause, "paused and pinned: no step and no automatic rollback"),
    "rollout-resume": (rollout_resume, "resumed"),
    "rollout-promote": (rollout_promote_early, "promoted early: the planned promotion starts now"),
    "rollout-abort": (rollout_abort, "aborted: its weight goes to 0 and the standby is restored"),
}


def rollout_move(*, fleet: Fleet, action: str, rollout_id: str, actor: str) -> ActionResult:
    """Pause, resume, promote early or abort the fleet's rollout `rollout_id`, exactly as the
    API does."""
    move, done = _ROLLOUT_MOVES[action]
    try:
        rollout = move(fleet_id=fleet.id, rollout_id=rollout_id, actor=actor)
    except ServiceError as exc:
        return ActionResult(False, exc.status, exc.code, exc.message)
    return ActionResult(
        True,
        200,
        "rollout_" + action.removeprefix("rollout-"),
        f"rollout {str(rollout.id)[:8]} of {rollout.model} {done}",
    )
