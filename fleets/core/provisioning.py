"""Provisioning of driver-backed domains: the phase table and the decisions, pure.

A domain in `provisioning` (or `stopping`) carries a driver phase in `driver_status`. Each
provisioning tick reads it, calls the `sky` CLI (outside any transaction), then writes the next
phase with one conditional UPDATE guarded by the attempt counter; every (from, to) phase pair is
checked against `PHASE_TRANSITIONS` first, like the state tables in `fleets.core.states`.

Phases of `provisioning`:
- replace: an old cluster may still exist (a failed domain being replaced): tear it down first;
- launch: submit a launch on the current candidate region/zone;
- wait: a launch was submitted; poll the request and the cluster until it is up or failed;
- backoff: the last launch failed; wait `provisionRetryBackoffMs`, then launch again;
- up: the cluster is up and its URLs are recorded; the first good heartbeat makes it ready;
- settled: ready, and (for a standby) its sleep-and-train posture was requested.
Phases of `stopping`: teardown (stop or down requested), then the domain moves to `stopped`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from fleets.core.policy import Policy
from fleets.core.states import DomainState, InvalidTransition


class Phase(StrEnum):
    REPLACE = "replace"
    LAUNCH = "launch"
    WAIT = "wait"
    BACKOFF = "backoff"
    UP = "up"
    SETTLED = "settled"
    TEARDOWN = "teardown"


P = Phase
# Every allowed (from, to) phase move. "" is a domain with no phase yet (never provisioned).
PHASE_TRANSITIONS: dict[str, frozenset[Phase]] = {
    "": frozenset({P.LAUNCH, P.REPLACE, P.TEARDOWN}),
    P.REPLACE: frozenset({P.LAUNCH, P.TEARDOWN}),
    P.LAUNCH: frozenset({P.WAIT, P.BACKOFF, P.TEARDOWN}),
    P.WAIT: frozenset({P.UP, P.BACKOFF, P.TEARDOWN}),
    P.BACKOFF: frozenset({P.LAUNCH, P.TEARDOWN}),
    P.UP: frozenset({P.SETTLED, P.REPLACE, P.TEARDOWN}),
    P.SETTLED: frozenset({P.REPLACE, P.TEARDOWN}),
    # A stopped domain provisions again from scratch (a stopped cluster restarts on launch).
    P.TEARDOWN: frozenset({P.LAUNCH, P.REPLACE}),
}

# Which phases each domain state may hold; a phase outside its state is a bug, refused.
PHASES_OF_STATE: dict[str, frozenset[Phase]] = {
    DomainState.PROVISIONING: frozenset({P.REPLACE, P.LAUNCH, P.WAIT, P.BACKOFF, P.UP}),
    DomainState.READY: frozenset({P.UP, P.SETTLED}),
    DomainState.DEGRADED: frozenset({P.UP, P.SETTLED}),
    DomainState.FAILED: frozenset({P.REPLACE, P.LAUNCH, P.WAIT, P.BACKOFF, P.UP, P.SETTLED}),
    DomainState.STOPPING: frozenset({P.TEARDOWN}),
    DomainState.STOPPED: frozenset({P.TEARDOWN}),
}


def check_phase(from_phase: str, to_phase: str) -> None:
    """Raise InvalidTransition unless the phase table allows from_phase -> to_phase."""
    allowed = PHASE_TRANSITIONS.get(from_phase)
    if allowed is None or to_phase not in allowed:
        raise InvalidTransition("provision_phase", from_phase or "(none)", to_phase)


def budget_spent(*, started_at: datetime | None, now: datetime, policy: Policy) -> bool:
    """Whether this provisioning round has used up `provisionTimeoutMs`."""
    if started_at is None:
        return False
    return now - started_at >= timedelta(milliseconds=policy.provision_timeout_ms)


def next_candidate(current: int, count: int, *, retry_elsewhere: bool) -> int:
    """Return the candidate to try after a failed launch: the next region/zone when the
    failure was about capacity there, the same one otherwise (credentials do not differ by
    region); wraps round so a long budget keeps cycling through the list."""
    if count <= 0:
        raise ValueError("a placement has at least one candidate")
    return (current + 1) % count if retry_elsewhere else current % count


def backoff_over(*, next_attempt_at: datetime | None, now: datetime) -> bool:
    return next_attempt_at is None or now >= next_attempt_at


@dataclass(frozen=True)
class ReplaceCandidate:
    """What the replacement decision needs to know about one domain."""

    state: str
    managed: bool  # driver-backed with launch settings
    is_active: bool
    was_active: bool  # the source of the last completed promotion (it failed over away)
    failed_since: datetime | None


def should_replace(domain: ReplaceCandidate, *, now: datetime, policy: Policy) -> str | None:
    """Return why a failed domain should be re-provisioned now, or None.

    Only a non-active, driver-managed, failed domain is replaced, after `replaceFailedGraceMs`
    (a flapping host may come back on its own, and replacing costs a new cluster). The active is
    never replaced here: routing still points at it, so failover must move off it first.
    """
    if not domain.managed or domain.is_active or domain.state != DomainState.FAILED:
        return None
    if domain.failed_since is None:
        return None
    if now - domain.failed_since < timedelta(milliseconds=policy.replace_failed_grace_ms):
        return None
    if domain.was_active:
        return "replace_failed_active" if policy.replace_failed_active else None
    return "replace_failed_standby" if policy.replace_failed_standby else None


def unreachable_past_grace(
    *, failing_since: datetime | None, now: datetime, policy: Policy
) -> bool:
    """Whether a domain's heartbeat has failed for `replaceFailedGraceMs`: a standby whose node
    is gone only ever reads as degraded (standbys are never escalated), so for a provisioned
    domain this is what "failed" means."""
    if failing_since is None:
        return False
    return now - failing_since >= timedelta(milliseconds=policy.replace_failed_grace_ms)


def stop_mode(*, domain_mode: str | None, policy: Policy) -> str:
    """Return how to tear a domain down: its own driver.stopMode, else the fleet policy's."""
    return domain_mode or policy.stop_mode
