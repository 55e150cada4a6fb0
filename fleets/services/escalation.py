"""Escalate an active domain that stayed degraded past its grace to failed.

The pure core decides whether escalation is due (`fleets.core.failover.should_escalate`); this
service re-checks every condition inside the one UPDATE that acts on it, because each of them
can change between the read and the write: the pointer can move, an operation can start, the
standby can go stale, the operator can switch autoFailover off.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q

from fleets.base.clock import iso
from fleets.core.model_health import ServerHealth
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    DomainState,
    InferenceState,
    OperationKind,
    SlotKind,
    check_transition,
)
from fleets.models import Domain, Event, Fleet, Id, ModelBinding, Operation, Slot
from fleets.services.events import event_record, guarded_update

# The event of an active whose escalation its data path holds (fleets.core.failover
# .escalation_held): once per degraded spell.
ESCALATION_HELD = "domain.degraded.held"


def _viable_standby_exists(now: datetime, stale_ms: int, seen_fresh: Iterable[Id] = ()) -> Exists:
    """Build the `Exists` twin of `fleets.core.failover.is_viable_standby` (outer: the active).

    `seen_fresh`: domains the caller saw fresh through their fleet's tick lease sightings
    (`fleets.reads.sightings`: a healthy host's unchanged heartbeats write no row); they count
    as fresh while their heartbeat is not failing."""
    fresh = Q(last_seen_at__gte=now - timedelta(milliseconds=stale_ms))
    vouched = [str(pk) for pk in seen_fresh]
    if vouched:
        fresh |= Q(pk__in=vouched, heartbeat_failing_since__isnull=True)
    standby = (
        Domain.objects.filter(fresh)
        .filter(
            fleet_id=OuterRef("fleet_id"),
            state=DomainState.READY,
        )
        .exclude(pk=OuterRef("pk"))
        .exclude(supervisor_url="")
        .filter(Exists(ModelBinding.objects.filter(domain_id=OuterRef("pk"))))
        .filter(
            ~Exists(
                Slot.objects.filter(
                    domain_id=OuterRef("pk"),
                    kind=SlotKind.INFERENCE,
                    state=InferenceState.FAILED,
                )
            )
        )
    )
    return Exists(standby)


def _data_path_failing(now: datetime, stale_ms: int) -> Exists:
    """Build the twin of "not `fleets.core.failover.data_path_serving`" (outer: the active):
    some model's own server is not up, or was not seen serving within the stale window."""
    unseen_since = now - timedelta(milliseconds=stale_ms)
    return Exists(
        ModelBinding.objects.filter(domain_id=OuterRef("pk")).filter(
            ~Q(health=ServerHealth.UP)
            | Q(serving_seen_at__isnull=True)
            | Q(serving_seen_at__lt=unseen_since)
            | Q(serving_seen_at__gt=now)  # seen "later" than now: a skewed clock, not evidence
        )
    )


def domain_escalate(
    *,
    domain_id: Id,
    now: datetime,
    degraded_grace_ms: int,
    heartbeat_stale_ms: int,
    actor: str = "reconciler",
    seen_fresh: Iterable[Id] = (),
) -> bool:
    """Move the degraded active `domain_id` to failed when every escalation condition holds.

    One conditional UPDATE checks, all at once: the domain is still degraded and has been since
    before the grace; it is still the fleet's active; the fleet's autoFailover is on; a viable
    standby exists; no promotion is in flight; and its data path fails too (some model server
    not up or not seen serving within `heartbeat_stale_ms`: a heartbeat may have just seen them
    all serving). Return whether it moved.
    """
    check_transition("domain", DomainState.DEGRADED, DomainState.FAILED)
    is_active = Exists(
        Fleet.objects.filter(pk=OuterRef("fleet_id"), active_domain_id=OuterRef("pk"))
    )
    # autoFailover defaults to false, so only an explicit true (JSON true) counts.
    auto_failover = Exists(Fleet.objects.filter(pk=OuterRef("fleet_id"), policy__autoFailover=True))
    # A promotion in flight is already moving routing; a demote is not, and must not hold back
    # the escalation (the tick then pre-empts it, fleets.core.preemption).
    idle = ~Exists(
        Operation.objects.filter(
            fleet_id=OuterRef("fleet_id"),
            state__in=IN_FLIGHT_OPERATION_STATES,
            kind=OperationKind.PROMOTE,
        )
    )
    guard = Domain.objects.filter(
        Q(pk=domain_id),
        Q(state=DomainState.DEGRADED),
        Q(state_updated_at__lte=now - timedelta(milliseconds=degraded_grace_ms)),
        is_active,
        auto_failover,
        idle,
        _viable_standby_exists(now, heartbeat_stale_ms, seen_fresh),
        _data_path_failing(now, heartbeat_stale_ms),
    )
    row = Domain.objects.filter(pk=domain_id).values("fleet_id", "state_updated_at").first()
    if row is None:
        return False
    degraded_for = int((now - row["state_updated_at"]).total_seconds() * 1000)
    moved = guarded_update(
        guard,
        {"state": DomainState.FAILED, "state_updated_at": now},
        {
            "fleet_id": row["fleet_id"],
            "domain_id": domain_id,
            "kind": "domain.degraded.escalated",
            "actor": actor,
            "data": {
                "from": DomainState.DEGRADED,
                "to": DomainState.FAILED,
                "degradedForMs": degraded_for,
                "graceMs": degraded_grace_ms,
            },
        },
    )
    return bool(moved)


def domain_escalation_held_report(
    *,
    fleet_id: Id,
    domain_id: Id,
    degraded_since: datetime,
    now: datetime,
    degraded_grace_ms: int,
    supervisor_failing_since: datetime | None,
    actor: str = "reconciler",
) -> bool:
    """Record, once per degraded spell, that the active outlasted its grace but is not
    escalated because its model servers still serve; return whether this call recorded it.

    Once per spell: no such event for the domain since it went degraded (`degraded_since`, its
    state_updated_at). The fleet's tick lease makes two concurrent writers rare, and a second
    row would only repeat the same news.
    """
    if Event.objects.filter(
        domain_id=domain_id, kind=ESCALATION_HELD, created_at__gte=degraded_since
    ).exists():
        return False
    event_record(
        fleet_id=fleet_id,
        domain_id=domain_id,
        kind=ESCALATION_HELD,
        actor=actor,
        data={
            "reason": "supervisor unreachable, data path serving",
            "degradedForMs": max(0, int((now - degraded_since).total_seconds() * 1000)),
            "graceMs": degraded_grace_ms,
            # None: the supervisor answers but cannot vouch for every model (direct checks did).
            "supervisorFailingSince": iso(supervisor_failing_since)
            if supervisor_failing_since
            else None,
        },
    )
    return True


def fleet_no_standby_report(
    *,
    fleet_id: Id,
    active_domain_id: Id | None,
    now: datetime,
    every_ms: int,
    reason: str,
    next_attempt_at: datetime | None = None,
    kind: str = "failover.no_viable_standby",
    more: dict[str, Any] | None = None,
    actor: str = "reconciler",
) -> bool:
    """Record "the active is lost and no standby can take over" at most once per `every_ms`
    per fleet, however many processes tick it; return whether this call recorded it.

    `next_attempt_at`: when the reason is a backoff, when the first held standby is due; when
    it is flap damping (`kind` failover.damped), when the hold-down ends."""
    moved = guarded_update(
        Fleet.objects.filter(pk=fleet_id).filter(
            Q(no_standby_reported_at__isnull=True)
            | Q(no_standby_reported_at__lte=now - timedelta(milliseconds=every_ms))
            | Q(no_standby_reported_at__gt=now)  # a clock that went back must not mute it
        ),
        {"no_standby_reported_at": now},
        {
            "fleet_id": fleet_id,
            "domain_id": active_domain_id,
            "kind": kind,
            "actor": actor,
            "data": {
                "reason": reason,
                **({"nextAttemptAt": iso(next_attempt_at)} if next_attempt_at else {}),
                **(more or {}),
            },
        },
    )
    return bool(moved)


def fleet_no_standby_clear(*, fleet_id: Id) -> None:
    """Forget the last no-standby report once failover is no longer needed, so the next loss
    is reported at once."""
    Fleet.objects.filter(pk=fleet_id, no_standby_reported_at__isnull=False).update(
        no_standby_reported_at=None
    )
