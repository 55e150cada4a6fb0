"""The drill's step executors (fleets.core.states.DRILL_STEPS), and its failure alert.

Every step is the promotion's or the demotion's own, on the standby: the drill proves exactly
the path a failover would take, up to the golden probe, and then walks the standby back into
posture with the demotion's steps. Routing is never touched: there is no switch step.
"""

from __future__ import annotations

from fleets.models import Operation
from fleets.reconciler import demote, promote
from fleets.services.events import event_record

EXECUTORS = {
    "stop_training": promote.stop_training,
    "verify_gpu": promote.verify_gpu,
    "wake": promote.wake,
    "probe": promote.probe,
    "sleep": demote.sleep,
    "start_training": demote.start_training,
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
