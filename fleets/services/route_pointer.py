"""The routing-pointer move: one compare-and-swap, guarded by the running operation."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, Q, QuerySet

from fleets.base import clock
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    CleanupState,
    DrillMode,
    OperationKind,
    OperationState,
)
from fleets.models import Domain, Fleet, Id, Operation
from fleets.services.events import event_record, guarded_update
from fleets.services.route_publish import revision_publish

# Postgres does it in one statement: the CTE locks the operation row (so a concurrent fail
# waits for us, or we see it failed), moves the pointer only where pointer and revision are what
# the caller read, and sets routing_committed and served_at (clients are served by the target
# from this commit on: the failover figure's end) in the same statement. A round-trip drill moves
# the pointer to its standby and back to its source; it never commits routing, because its
# failure clean-up must be free to route back (fleets/reconciler/steps/cleanup.py). Every move
# clears the fleet's weighted splits (fleets/core/route_split.py): one domain serves it all.
_SWITCH_SQL = """
WITH op AS (
    SELECT id, kind FROM fleets_operation
    WHERE id = %(op)s AND fleet_id = %(fleet)s AND state = %(running)s
      AND ((kind = %(promote)s AND target_domain_id = %(target)s)
        OR (kind = %(drill)s AND drill_mode = %(round_trip)s
            AND (target_domain_id = %(target)s OR source_domain_id = %(target)s)))
    FOR UPDATE
), moved AS (
    UPDATE fleets_fleet f
    SET active_domain_id = %(target)s, route_revision = f.route_revision + 1,
        route_splits = '{}', updated_at = %(now)s
    WHERE f.id = %(fleet)s AND f.route_revision = %(revision)s
      AND f.active_domain_id IS NOT DISTINCT FROM %(expected)s
      AND EXISTS (SELECT 1 FROM op)
      AND EXISTS (SELECT 1 FROM fleets_domain d WHERE d.id = %(target)s AND d.fleet_id = %(fleet)s)
    RETURNING f.route_revision
)
UPDATE fleets_operation o SET routing_committed = (o.kind = %(promote)s),
    served_at = CASE WHEN o.kind = %(promote)s THEN %(now)s ELSE o.served_at END
FROM moved WHERE o.id = %(op)s
RETURNING moved.route_revision
"""
# The enum values the statement compares with, passed as parameters (plain strings).
_SWITCH_VALUES = {
    "running": OperationState.RUNNING.value,
    "promote": OperationKind.PROMOTE.value,
    "drill": OperationKind.DRILL.value,
    "round_trip": DrillMode.ROUND_TRIP.value,
}


def _as_uuid(value: Id | None) -> uuid.UUID | None:
    return value if value is None or isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def route_switch(
    *,
    fleet_id: Id,
    operation_id: Id,
    target_domain_id: Id,
    expected_active_id: Id | None,
    expected_revision: int,
    actor: str = "reconciler",
) -> int | None:
    """Point the fleet at `target_domain_id`; return the new revision, or None if the CAS lost.

    Wins only where the pointer and revision are still what the caller read, the target is in the
    fleet, and the driving promotion is still running; it sets that operation's
    `routing_committed` and `served_at` (the move's own time) atomically with the move.
    """
    params: dict[str, Any] = {
        "op": _as_uuid(operation_id),
        "fleet": _as_uuid(fleet_id),
        "target": _as_uuid(target_domain_id),
        "expected": _as_uuid(expected_active_id),
        "revision": expected_revision,
        "now": clock.now(),
    }
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(_SWITCH_SQL, {**params, **_SWITCH_VALUES})
                row = cursor.fetchone()
            new_revision: int | None = int(row[0]) if row else None
        else:
            new_revision = _switch_serialized(params)
        if new_revision is not None:
            _switched(
                fleet_id,
                operation_id,
                actor,
                from_domain_id=expected_active_id,
                to_domain_id=target_domain_id,
                revision=new_revision,
            )
    return new_revision


def _switched(
    fleet_id: Id,
    operation_id: Id,
    actor: str,
    *,
    from_domain_id: Id | None,
    to_domain_id: Id,
    revision: int,
    **more: str,
) -> None:
    """Announce the moved pointer and record it (inside the transaction that moved it)."""
    revision_publish(str(fleet_id), revision)
    event_record(
        fleet_id=fleet_id,
        operation_id=operation_id,
        domain_id=to_domain_id,
        kind="fleet.route.switched",
        actor=actor,
        data={
            "fromDomainId": str(from_domain_id) if from_domain_id else None,
            "toDomainId": str(to_domain_id),
            "revision": revision,
            **more,
        },
    )


def _switch_serialized(p: dict[str, Any]) -> int | None:
    """Do the same move on SQLite, where DML in a CTE is not supported.

    Safe as two statements: the settings open every transaction IMMEDIATE, so SQLite holds its
    single write lock from BEGIN and no other writer can interleave between them.
    """
    op = (
        Operation.objects.filter(pk=p["op"], fleet_id=p["fleet"], state=OperationState.RUNNING)
        .filter(
            Q(kind=OperationKind.PROMOTE, target_domain_id=p["target"])
            | Q(kind=OperationKind.DRILL, drill_mode=DrillMode.ROUND_TRIP)
            & (Q(target_domain_id=p["target"]) | Q(source_domain_id=p["target"]))
        )
        .values_list("kind", flat=True)
        .first()
    )
    running = op is not None
    in_fleet = Domain.objects.filter(pk=p["target"], fleet_id=p["fleet"]).exists()
    if not (running and in_fleet):
        return None
    moved = Fleet.objects.filter(
        pk=p["fleet"],
        route_revision=p["revision"],
        active_domain_id=p["expected"],
    ).update(
        active_domain_id=p["target"],
        route_revision=F("route_revision") + 1,
        route_splits={},
        updated_at=p["now"],
    )
    if not moved:
        return None
    if op == OperationKind.PROMOTE:
        Operation.objects.filter(pk=p["op"]).update(routing_committed=True, served_at=p["now"])
    return int(p["revision"]) + 1


def pointer_movers(fleet_id: Id) -> QuerySet[Operation]:
    """Return the fleet's in-flight operations that may move the pointer (promotions, drills)."""
    return Operation.objects.filter(
        fleet_id=fleet_id,
        state__in=IN_FLIGHT_OPERATION_STATES,
        kind__in=[OperationKind.PROMOTE, OperationKind.DRILL],
    )


def route_switch_back(
    *,
    fleet_id: Id,
    operation_id: Id,
    from_domain_id: Id,
    to_domain_id: Id,
    expected_revision: int,
    actor: str = "reconciler",
) -> int | None:
    """Point the fleet back from a failed round-trip drill's standby to its original active.

    One conditional UPDATE: wins only where the pointer and revision are what the caller read,
    the drill, ended, still holds its pending clean-up (so a later operation that moved the
    pointer on is never undone), and no promotion or drill is in flight (a failover that
    pre-empted the drill owns the pointer now: routing moves once, by it, never by both).
    Return the new revision, or None if the CAS lost.
    """
    drill = Operation.objects.filter(
        pk=operation_id,
        fleet_id=fleet_id,
        kind=OperationKind.DRILL,
        drill_mode=DrillMode.ROUND_TRIP,
        state__in=[OperationState.FAILED, OperationState.CANCELLED],
        cleanup=CleanupState.PENDING,
        target_domain_id=_as_uuid(from_domain_id),
        source_domain_id=_as_uuid(to_domain_id),
    )
    revision = expected_revision + 1
    moved = guarded_update(
        Fleet.objects.filter(
            pk=fleet_id,
            route_revision=expected_revision,
            active_domain_id=_as_uuid(from_domain_id),
        ).filter(Exists(drill), ~Exists(pointer_movers(fleet_id))),
        {
            "active_domain_id": to_domain_id,
            "route_revision": F("route_revision") + 1,
            "route_splits": {},
            "updated_at": clock.now(),
        },
        then=lambda: _switched(
            fleet_id,
            operation_id,
            actor,
            from_domain_id=from_domain_id,
            to_domain_id=to_domain_id,
            revision=revision,
            reason="drill_failed_route_back",
        ),
    )
    return revision if moved else None
