"""Failover: when the active is lost, which standby takes over, and when to escalate.

Pure: the caller supplies the clock (`now`, timezone-aware) and re-checks "nothing in flight"
in the database, where the decision is acted on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from fleets.core.flapping import Damping, damped_hold
from fleets.core.model_health import ServerHealth, serving_recently
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView
from fleets.core.states import PROMOTABLE_DOMAIN_STATES, DomainState, InferenceState, SlotKind

ACTIVE_FAILED = "active_failed"
ACTIVE_STALE = "active_stale"
NO_VIABLE_STANDBY = "no_viable_standby"
# Every standby that could take over is waiting out its backoff after failed attempts.
FAILOVER_BACKOFF = "failover_backoff"
# The fleet failed over too often lately: the active must stay lost longer (fleets.core.flapping).
FAILOVER_DAMPED = "failover_damped"

_STATE_RANK: dict[str, int] = {DomainState.READY: 0, DomainState.DEGRADED: 1}


def _age_ms(seen: datetime, now: datetime) -> float:
    return (now - seen).total_seconds() * 1000


def is_stale(domain: DomainView, policy: Policy, now: datetime) -> bool:
    """Tell whether the domain's last heartbeat is older than `heartbeat_stale_ms`.

    A never-seen domain is not stale: a freshly seeded fleet must not fail over before the
    first heartbeat had a chance to run.
    """
    return domain.last_seen_at is not None and (
        _age_ms(domain.last_seen_at, now) > policy.heartbeat_stale_ms
    )


def is_viable_standby(domain: DomainView, policy: Policy, now: datetime) -> bool:
    """Tell whether the domain could plausibly complete a promotion right now."""
    return (
        domain.state == DomainState.READY
        and bool(domain.supervisor_url)  # something must drive the steps
        and domain.has_bindings  # something must be woken, probed and routed to
        and domain.last_seen_at is not None
        and not is_stale(domain, policy, now)
        and not domain.has_failed_inference_slot
    )


def rank_standbys(fleet: FleetView, now: datetime | None = None) -> list[DomainView]:
    """Order the non-active domains by promotion preference.

    Ready before degraded before anything else, then priority (lower first), then the freshest
    heartbeat (never-seen last), then slug. Failover and route intent share this order; the
    slug tiebreak compares code points so every replica ranks the same.
    """
    del now  # part of the signature so a future freshness window needs no call-site change

    def key(d: DomainView) -> tuple[int, int, int, float, str]:
        seen = (0, -d.last_seen_at.timestamp()) if d.last_seen_at else (1, 0.0)
        return (_STATE_RANK.get(d.state, 2), d.priority, *seen, d.slug)

    return sorted(fleet.standbys, key=key)


def lost_reason(domain: DomainView, policy: Policy, now: datetime) -> str | None:
    """Say why `domain` can no longer serve as the active (ACTIVE_FAILED, ACTIVE_STALE), or None.

    The one test of "the active is lost": failover detection asks it of the active, and
    pre-emption of a promotion whose routing committed asks it of the domain routed to.
    """
    if domain.state == DomainState.FAILED:
        return ACTIVE_FAILED
    if is_stale(domain, policy, now) and not serving_recently(
        domain.serving_seen_at, now=now, window_ms=policy.heartbeat_stale_ms
    ):
        # Staleness alone never fails over an active whose model servers were seen serving
        # within the window: its supervisor is gone, not its traffic (degraded, with a grace).
        return ACTIVE_STALE
    return None


@dataclass(frozen=True)
class FailoverDecision:
    """Promote `target_id` because of `reason`; `target_id` None means nobody can take over."""

    target_id: str | None
    reason: str


def detect_failover(
    fleet: FleetView,
    now: datetime,
    held: Mapping[str, datetime] | None = None,
    damping: Damping | None = None,
    first_failed_request: datetime | None = None,
) -> FailoverDecision | None:
    """Decide whether the reconciler should promote a standby on its own, and which one.

    Return None when there is nothing to do: autoFailover off, no routing pointer, or an
    active that is neither failed nor stale. `held` maps the standbys still backing off after
    failed automatic promotions (fleets.core.backoff) to their next attempt: they are passed
    over, and when nobody else can take over the answer is FAILOVER_BACKOFF. `damping`: the
    fleet failed over too often lately (fleets.core.flapping); until the active has been lost
    without a break (`DomainView.lost_since`) for the damping's hold-down the answer is
    FAILOVER_DAMPED.
    """
    policy, active = fleet.policy, fleet.active
    if not policy.auto_failover or active is None:
        return None
    reason = lost_reason(active, policy, now)
    if reason is None:
        return None
    if damped_hold(damping, active.lost_since(first_failed_request), now):
        return FailoverDecision(None, FAILOVER_DAMPED)
    ranked = rank_standbys(fleet, now)
    waiting = held or {}
    candidates = [d for d in ranked if d.id not in waiting]
    target = next((d for d in candidates if is_viable_standby(d, policy, now)), None)
    if target is None:
        # The active already serves nothing, so a long shot beats certain downtime: any
        # promotable standby with a supervisor and bindings; the probe still guards routing.
        target = next((d for d in candidates if _long_shot(d)), None)
    if target is None:
        if any(d.id in waiting and _long_shot(d) for d in ranked):
            return FailoverDecision(None, FAILOVER_BACKOFF)
        return FailoverDecision(None, NO_VIABLE_STANDBY)
    return FailoverDecision(target.id, reason)


def _long_shot(domain: DomainView) -> bool:
    return (
        domain.state in PROMOTABLE_DOMAIN_STATES
        and bool(domain.supervisor_url)
        and domain.has_bindings
    )


def should_escalate(fleet: FleetView, now: datetime, degraded_since: datetime | None) -> bool:
    """Tell whether the degraded active has outlasted its grace and should become failed.

    `degraded_since` is the active's state_updated_at. Escalating throws away the active's
    still-healthy models, so it happens only when a viable standby can take over. Standbys are
    never escalated: failed would cost them their promotability.
    """
    policy, active = fleet.policy, fleet.active
    if not policy.auto_failover or active is None or degraded_since is None:
        return False
    if active.state != DomainState.DEGRADED:
        return False
    if _age_ms(degraded_since, now) <= policy.degraded_grace_ms:
        return False
    if data_path_serving(active, policy, now):
        return False  # the data path decides: its model servers serve (escalation_held)
    return any(is_viable_standby(d, policy, now) for d in fleet.standbys)


def data_path_serving(domain: DomainView, policy: Policy, now: datetime) -> bool:
    """Tell whether every model of `domain` is served: its own server up and seen serving
    within `heartbeat_stale_ms` (by its supervisor, or asked directly when the supervisor
    cannot say).

    The control plane losing the supervisor (dead, partitioned away, too slow or saturated to
    answer within its deadline) is no reason to move traffic that the model servers still
    take: such an active stays degraded, never escalated. A model server that refuses, answers
    5xx, sleeps, or has not been seen within the window (a timeout is no news, so a partition
    that cuts the model servers too ages out) is the data path failing too.
    """
    window = policy.heartbeat_stale_ms
    return domain.has_bindings and all(
        m.health == ServerHealth.UP
        and serving_recently((m.serving_seen_at,), now=now, window_ms=window)
        for m in domain.models
    )


def escalation_held(fleet: FleetView, now: datetime) -> bool:
    """Tell whether the active is degraded and its escalation is held by its data path.

    The one test behind the event, the metric (`haru_fleet_active_held_by_data_path`) and the
    fleet page's "degraded: supervisor unreachable, data path serving".
    """
    active = fleet.active
    return (
        active is not None
        and active.state == DomainState.DEGRADED
        and data_path_serving(active, fleet.policy, now)
    )


# After a failed restore, the same standby is not asked again for this long: a host whose models
# refuse to sleep must not get a demotion per tick.
RESTORE_RETRY_AFTER_MS = 300_000
# A standby's inference slot reads failed when its supervisor answers but the models are awake
# (the heartbeat rules), and serving while it was being promoted.
_AWAKE_ON_STANDBY = frozenset({InferenceState.FAILED, InferenceState.SERVING})


def standby_to_restore(
    fleet: FleetView,
    now: datetime,
    last_failed_restore: Mapping[str, datetime] | None = None,
    being_provisioned: frozenset[str] = frozenset(),
) -> DomainView | None:
    """Pick a standby that came back healthy but awake, to demote into standby posture.

    This is the host that was the active, failed over, and returned after the promotion's
    best-effort demote steps ran out of time: it reads ready with its models awake, costing a
    GPU's worth of memory and its training time. With `restoreStandbyOnReturn` (the default)
    the reconciler demotes it. `last_failed_restore` maps domain id to when its last demotion
    failed; a recent one backs off (RESTORE_RETRY_AFTER_MS). Domains in `being_provisioned`
    are left to the provisioning pass, which settles a new node's posture itself: two passes
    asking for the same demotion would only race. The caller re-checks that nothing is in
    flight, in the database.
    """
    if not fleet.policy.restore_standby_on_return or fleet.active is None:
        return None
    failed_at = last_failed_restore or {}
    for domain in sorted(fleet.standbys, key=lambda d: d.slug):
        if domain.state != DomainState.READY or not domain.supervisor_url:
            continue
        if domain.id in being_provisioned:
            continue
        if domain.last_seen_at is None or is_stale(domain, fleet.policy, now):
            continue
        if not any(
            s.kind == SlotKind.INFERENCE and s.state in _AWAKE_ON_STANDBY for s in domain.slots
        ):
            continue
        last = failed_at.get(domain.id)
        if last is not None and _age_ms(last, now) < RESTORE_RETRY_AFTER_MS:
            continue
        return domain
    return None
