"""The clean-up after a failed or cancelled promotion: its target back in standby posture.

`operation_fail` and `operation_cancel` record the clean-up as pending on the operation, in the
transaction that ends it; this module does the supervisor side (sleep the models, restart
training once the sleep is proven) outside any transaction, then records the outcome. The tick
that failed the operation runs it at once; a pending one left by a worker that died, or by a
cancel from the API, is finished by the next tick of the fleet (`pending_cleanups_run`).

A round-trip drill may have left routing on its standby: its clean-up first routes back to the
original active if that one still serves (`route_back`), then puts whichever of the two does not
serve back in standby posture, so the fleet ends no worse than the drill found it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fleets.core.golden import Verdict
from fleets.core.policy import Policy
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, CleanupState, DrillMode, OperationKind
from fleets.models import Domain, Fleet, Id, Operation
from fleets.reconciler import golden
from fleets.reconciler.steps import posture
from fleets.reconciler.steps.base import SlotMover
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.transport import CALL_CAP_S
from fleets.services.events import event_record
from fleets.services.operations import operation_cleanup_claim, operation_cleanup_finish
from fleets.services.route_pointer import pointer_movers, route_switch_back

log = logging.getLogger(__name__)

# How long a tick holds a clean-up: both postures take at most three calls each, a round-trip
# drill's route-back two more (status, golden probe), every call capped at CALL_CAP_S (8 x 10 s),
# so a holder alive past this is not running it any more.
CLEANUP_LEASE_MS = 90_000
# Clean-ups finished per tick: a fleet with a backlog (many failures while no worker ran)
# catches up over a few ticks instead of one unbounded one.
MAX_CLEANUPS_PER_TICK = 4


def pending_cleanups(fleet_id: Id) -> list[Operation]:
    """Return the fleet's operations whose clean-up is still pending, oldest first."""
    return list(
        Operation.objects.filter(fleet_id=fleet_id, cleanup=CleanupState.PENDING)
        .select_related("target_domain", "source_domain")
        .order_by("finished_at")[:MAX_CLEANUPS_PER_TICK]
    )


def pending_cleanups_run(
    *,
    fleet_id: Id,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    actor: str = "reconciler",
) -> int:
    """Finish the fleet's pending clean-ups; return how many this tick finished."""
    return sum(
        cleanup_run(operation=op, policy=policy, client_for=client_for, actor=actor)
        for op in pending_cleanups(fleet_id)
    )


def cleanup_run(
    *,
    operation: Operation,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    actor: str = "reconciler",
) -> bool:
    """Claim the operation's pending clean-up, do it, record the outcome; False if not ours."""
    if not operation_cleanup_claim(operation_id=operation.id, lease_ms=CLEANUP_LEASE_MS):
        return False
    if _round_trip(operation):
        # First routing (the original active back, if it still serves), then whichever of the
        # two domains does not serve goes back to standby posture.
        route_back(operation=operation, policy=policy, client_for=client_for, actor=actor)
        operation.target_domain = _not_serving(operation)
    skip = _skip_reason(operation)
    if skip is not None:
        return operation_cleanup_finish(
            operation_id=operation.id,
            outcome=CleanupState.SKIPPED,
            actor=actor,
            data={"message": skip},
        )
    reached = promotion_cleanup(
        operation=operation, policy=policy, client_for=client_for, actor=actor
    )
    outcome = CleanupState.DONE if reached else CleanupState.INCOMPLETE
    if not reached:
        log.warning("operation %s: clean-up of its target incomplete", operation.id)
    return operation_cleanup_finish(operation_id=operation.id, outcome=outcome, actor=actor)


def _round_trip(operation: Operation) -> bool:
    return operation.kind == OperationKind.DRILL and operation.drill_mode == DrillMode.ROUND_TRIP


def _not_serving(operation: Operation) -> Domain | None:
    """The domain of a round-trip drill to put back in standby posture: the drilled standby,
    unless routing stayed on it (then the original active, which could not take it back)."""
    active = Fleet.objects.filter(pk=operation.fleet_id).values_list("active_domain_id", flat=True)
    if operation.source_domain is not None and active.first() == operation.target_domain_id:
        return operation.source_domain
    return operation.target_domain


def _serving(domain: Domain, policy: Policy, client: SupervisorClient) -> str | None:
    """Say why `domain` cannot take traffic back now, or None when it can: every bound model
    reported awake and reproducing its golden baseline (an unrecorded one counts as serving)."""
    targets = golden.targets_of(domain)
    if not targets:
        return f"domain {domain.slug} has no model bindings"
    status = client.status(timeout=CALL_CAP_S)
    report = status.value
    if report is None:
        return f"domain {domain.slug} did not report its status"
    asleep = [
        t.binding.name
        for t in targets
        if (m := report.model(t.binding.name)) is None or m.sleeping is not False
    ]
    if asleep:
        return f"not awake on {domain.slug}: {', '.join(sorted(set(asleep)))}"
    probed = golden.ask(
        client, targets, policy, timeout=CALL_CAP_S, timeout_ms=int(CALL_CAP_S * 900)
    ).value
    if probed is None:
        return f"domain {domain.slug} did not answer its golden probe"
    bad = [
        j.message
        for _, j in golden.judge_all(domain.fleet_id, targets, probed, policy)
        if j.verdict in (Verdict.FAILED, Verdict.MISMATCH)
    ]
    return "; ".join(bad) if bad else None


def route_back(
    *,
    operation: Operation,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    actor: str = "reconciler",
) -> bool:
    """Route a failed round-trip drill back to its original active if routing is on the
    drilled standby and the original still serves; True if this call moved it.

    The original is proven serving first (awake, golden probe passes): a drill never hands
    traffic to a domain it half-demoted. Otherwise routing stays on the standby, which passed
    its own probe before it took traffic, and the original goes back to standby posture.
    """
    original, standby = operation.source_domain, operation.target_domain
    if original is None or standby is None:
        return False
    fleet = (
        Fleet.objects.filter(pk=operation.fleet_id)
        .values("active_domain_id", "route_revision")
        .get()
    )
    if fleet["active_domain_id"] != standby.id:
        return False  # routing never left the original, or the second switch committed

    def record(ok: bool, message: str) -> None:
        _record(operation, original, "route_back", actor, ok=ok, message=message[:500])

    mover = pointer_movers(operation.fleet_id).values("id", "kind").first()
    if mover is not None:
        # A failover that pre-empted the drill (its standby was lost) owns routing now: routing
        # back beside it would move the pointer twice for one outage (route_switch_back
        # refuses it in its UPDATE too; this says why on the timeline).
        record(False, f"routing left to {mover['kind']} {mover['id']}, in flight")
        return False
    why = (
        f"domain {original.slug} has no supervisor URL"
        if not original.supervisor_url
        else _serving(original, policy, client_for(original))
    )
    if why is not None:
        record(False, f"routing stays on {standby.slug}: {why}")
        return False
    revision = route_switch_back(
        fleet_id=operation.fleet_id,
        operation_id=operation.id,
        from_domain_id=standby.id,
        to_domain_id=original.id,
        expected_revision=fleet["route_revision"],
        actor=actor,
    )
    if revision is None:
        record(False, "the routing pointer changed meanwhile; left where it is")
        return False
    record(True, f"routing back on {original.slug} (revision {revision})")
    return True


def _record(operation: Operation, domain: Domain, kind: str, actor: str, **data: Any) -> None:
    """Record one move of the operation's clean-up on `domain` (`operation.cleanup.<kind>`)."""
    event_record(
        fleet_id=operation.fleet_id,
        domain_id=domain.id,
        operation_id=operation.id,
        kind=f"operation.cleanup.{kind}",
        actor=actor,
        data=data,
    )


def _skip_reason(operation: Operation) -> str | None:
    """Say why the target must be left alone now, or None to clean it up."""
    target = operation.target_domain
    if target is None:
        return "the target domain is gone"
    if not target.supervisor_url:
        return f"domain {target.slug} has no supervisor URL"
    # Never sleep what serves traffic, nor what another operation is moving (a failover that
    # pre-empted this one may have picked the same domain).
    active = Fleet.objects.filter(pk=operation.fleet_id).values_list("active_domain_id", flat=True)
    if active.first() == target.id:
        return f"domain {target.slug} is the active domain now"
    moving = Operation.objects.filter(
        fleet_id=operation.fleet_id,
        state__in=IN_FLIGHT_OPERATION_STATES,
        target_domain_id=target.id,
    ).first()
    if moving is not None:
        return f"{moving.kind} {moving.id} now drives domain {target.slug}"
    return None


def promotion_cleanup(
    *,
    operation: Operation,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    actor: str = "reconciler",
) -> bool:
    """Best effort: put the target back in standby posture, each move recorded as an event.

    Sleep its models; restart training only once the sleep is proven, as for the old active.
    Return whether the posture was reached; when not, the restore-standby pass (policy
    `restoreStandbyOnReturn`) or an operator's demote finishes it.
    """
    target = operation.target_domain
    assert target is not None and target.supervisor_url  # _skip_reason checked
    where = posture.Target(client_for(target), target, SlotMover(operation.id, actor))

    def record(kind: str, **data: Any) -> None:
        _record(operation, target, kind, actor, **data)

    def call_cap(budget_ms: int) -> Callable[[], float]:
        return lambda: min(CALL_CAP_S, budget_ms / 1000)

    slept = posture.ensure_asleep(where, call_cap(policy.sleep_timeout_ms))
    record("sleep", ok=slept.reached, message=slept.message)
    if not slept.reached:
        record("training", ok=False, skipped=True, message="sleep not proven; training left off")
        return False
    trained = posture.ensure_training(where, call_cap(policy.start_training_timeout_ms))
    record("training", ok=trained.reached, message=trained.message)
    return trained.reached
