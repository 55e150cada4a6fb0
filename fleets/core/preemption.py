"""Pre-emption: which in-flight operation an active failure ends so failover can start.

Only one operation runs per fleet, so anything in flight when the active is lost blocks the
failover. An operation that will itself put a domain in front of traffic (a promotion of a
standby that can still serve) is left to finish; anything else (a demote, a promotion of a
domain that can no longer serve) is cancelled with reason `preempted`. A promotion whose
routing has committed is never pre-empted: the pointer already moved, and only its best-effort
steps on the old active remain, each bounded by its own budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fleets.core.failover import FailoverDecision, is_stale
from fleets.core.read_model import FleetView
from fleets.core.states import PROMOTABLE_DOMAIN_STATES, OperationKind

PREEMPTED = "preempted"


@dataclass(frozen=True)
class InFlight:
    """What the rule needs of the in-flight operation."""

    kind: str
    target_id: str | None
    routing_committed: bool


def leads_to_serving(fleet: FleetView, op: InFlight, now: datetime) -> bool:
    """Tell whether finishing `op` would put a domain that can serve in front of traffic."""
    if op.kind != OperationKind.PROMOTE or op.target_id is None:
        return False
    if op.routing_committed:
        return True
    target = fleet.domain(op.target_id)
    return (
        target is not None
        and target.state in PROMOTABLE_DOMAIN_STATES
        and bool(target.supervisor_url)
        and target.has_bindings
        and not is_stale(target, fleet.policy, now)
    )


def should_preempt(
    failover: FailoverDecision | None, op: InFlight, *, leads_to_serving: bool
) -> bool:
    """Decide whether an active failure pre-empts `op`.

    `failover` is `detect_failover`'s answer as if nothing were in flight: None (the active is
    fine, or auto-failover is off) pre-empts nothing, and neither does a lost active with nobody
    to promote (cancelling would only throw work away).
    """
    if failover is None or failover.target_id is None:
        return False
    if op.kind != OperationKind.PROMOTE:
        return True  # a demote never leads to a serving domain
    if op.routing_committed:
        return False
    return not leads_to_serving
