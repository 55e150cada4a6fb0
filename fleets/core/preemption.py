"""Pre-emption: which in-flight operation an active failure ends, and how it ends.

Only one operation runs per fleet, so anything in flight when the active is lost blocks the
failover. The rule asks one question of it: would finishing it put, or keep, a domain that can
serve in front of traffic (`leads_to_serving`)? If not, and someone can take over, it is ended
(`should_preempt`).

- A promotion whose routing has not committed leads to serving when its target can still serve
  (promotable, supervised, bound, fresh): it is left to finish.
- A promotion whose routing committed leads to serving for as long as the domain it routed to is
  not lost itself (`lost_reason`, the test failover detection applies to the active). Once that
  domain is lost, all the promotion has left are its best-effort steps on the old active
  (`demote_old_sleep`, `demote_old_train`), bounded only by sleepTimeoutMs and
  startTrainingTimeoutMs (90 s by default), and they may be putting to sleep the very domain
  the failover needs: they are pre-empted.
- A demote and a drill never lead to serving.

How an ended operation ends (`ending`) depends on what it did, and an operator's cancel ends it
the same way:

- Nothing committed (every demote, every drill, a promotion before its switch): cancelled; its
  clean-up restores standby posture.
- A promotion whose routing committed did move routing, so it ends succeeded, never cancelled,
  each step it did not run recorded as skipped (`steps_left`). The old active's posture is then
  the failover's (when it is the failover's target), or the heartbeat's and the restore-standby
  pass's (`restoreStandbyOnReturn`).
- Committed, but the switch step not recorded yet (the moment between the pointer's CAS and the
  step's record): not yet; the next look finds it at its first best-effort step.

A round-trip drill moves routing twice but never commits it (its clean-up must stay free to
route back), and every step of it is part of what it proves (a timeout of its demotion steps
fails it). So at any step it ends cancelled:

- After its first switch, routing is on the drilled standby; a lost standby is a real outage.
  The drill ends pre-empted and the real failover takes the fleet (usually back to the original
  active). The drill's clean-up leaves routing to that failover (`route_switch_back` refuses
  while a promotion is in flight) and never sleeps the failover's target.
- After its second switch, routing is back on the original active; a lost original has the
  shape of a committed promotion's loss, but the drill has not proved the standby's return to
  standby posture, so it reads cancelled, not passed. Its demotion of the standby (the
  failover's likely target) is not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from fleets.core.failover import FailoverDecision, is_stale, lost_reason
from fleets.core.read_model import FleetView
from fleets.core.states import (
    BEST_EFFORT_STEPS,
    PROMOTABLE_DOMAIN_STATES,
    OperationErrorCode,
    OperationKind,
    steps_for,
)

PREEMPTED = OperationErrorCode.PREEMPTED


class Ending(StrEnum):
    """How an operation that is ended early (pre-empted or cancelled) ends."""

    CANCEL = "cancel"  # nothing committed: cancelled, its clean-up restores standby posture
    SKIP_REST = "skip_rest"  # routing committed: succeeded, the remaining steps skipped
    NOT_YET = "not_yet"  # routing committed a moment ago, its switch not recorded yet


@dataclass(frozen=True)
class InFlight:
    """What the rule needs of the in-flight operation."""

    kind: str
    target_id: str | None
    routing_committed: bool
    current_step: str = ""
    drill_mode: str = ""


def leads_to_serving(fleet: FleetView, op: InFlight, now: datetime) -> bool:
    """Tell whether finishing `op` would put (or keep) a domain that can serve in front of
    traffic."""
    if op.kind != OperationKind.PROMOTE or op.target_id is None:
        return False
    target = fleet.domain(op.target_id)
    if target is None:
        return False
    if op.routing_committed:
        # The pointer already moved there: what is left changes nothing for traffic, so it
        # leads to serving exactly as long as the domain routed to is not lost.
        return (
            fleet.active_domain_id == target.id and lost_reason(target, fleet.policy, now) is None
        )
    return (
        target.state in PROMOTABLE_DOMAIN_STATES
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
    to promote (ending it would only throw work away).
    """
    if failover is None or failover.target_id is None:
        return False
    if op.kind != OperationKind.PROMOTE:
        return True  # a demote or a drill never leads to a serving domain
    return not leads_to_serving


def ending(op: InFlight) -> Ending:
    """Say how `op` ends when it is pre-empted or cancelled (see the module's docstring)."""
    if op.kind == OperationKind.PROMOTE and op.routing_committed:
        return Ending.SKIP_REST if op.current_step in BEST_EFFORT_STEPS else Ending.NOT_YET
    return Ending.CANCEL


def steps_left(op: InFlight) -> tuple[str, ...]:
    """Return the steps an early end does not run: the current one and every one after it."""
    steps = steps_for(op.kind, op.drill_mode)
    if op.current_step not in steps:
        return ()
    return steps[steps.index(op.current_step) :]
