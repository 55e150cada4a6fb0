"""Event and operation retention: drop history older than HARU_EVENT_RETENTION_DAYS.

Kept whatever their age: every operation still in flight, and each fleet's last
KEEP_PROMOTIONS succeeded promotions with their events (the failover chart and the overview's
"last failover" read them). Events of kept operations stay; the rest go by age. Deleted in
batches of BATCH rows per statement, so a first run over a large table never holds one long
lock. Fleet archives (fleet_delete) are never touched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from fleets.core.states import IN_FLIGHT_OPERATION_STATES, OperationKind, OperationState
from fleets.models import Event, Fleet, Operation

# At least the failover chart's bar count (fleets.dashboard.selectors.CHART_LIMIT; a test
# checks it), so the chart looks the same before and after a prune.
KEEP_PROMOTIONS = 24
BATCH = 2000
# Finished means one of these: an operation in flight is never pruned.
_FINISHED = (OperationState.SUCCEEDED, OperationState.FAILED, OperationState.CANCELLED)


@dataclass(frozen=True)
class PruneReport:
    events: int
    operations: int
    dry_run: bool = False


def _kept_operation_ids() -> set[uuid.UUID]:
    kept = set(
        Operation.objects.filter(state__in=IN_FLIGHT_OPERATION_STATES).values_list("id", flat=True)
    )
    for fleet_id in Fleet.objects.values_list("id", flat=True):
        kept.update(
            Operation.objects.filter(
                fleet_id=fleet_id, kind=OperationKind.PROMOTE, state=OperationState.SUCCEEDED
            )
            .order_by("-finished_at")
            .values_list("id", flat=True)[:KEEP_PROMOTIONS]
        )
    return kept


def _delete_in_batches(queryset: QuerySet[Any]) -> int:
    total = 0
    while True:
        ids = list(queryset.values_list("id", flat=True)[:BATCH])
        if not ids:
            return total
        with transaction.atomic():
            queryset.model.objects.filter(id__in=ids).delete()
        total += len(ids)
        if len(ids) < BATCH:
            return total


def retention_cutoff(now: datetime, days: int) -> datetime:
    return now - timedelta(days=days)


def history_prune(*, older_than: datetime, dry_run: bool = False) -> PruneReport:
    """Delete events created and operations finished before `older_than`, keeping the above."""
    kept = _kept_operation_ids()
    old_events = (
        Event.objects.filter(created_at__lt=older_than)
        .exclude(operation_id__in=kept)
        .order_by("id")
    )
    old_operations = (
        Operation.objects.filter(state__in=_FINISHED, finished_at__lt=older_than)
        .exclude(id__in=kept)
        .order_by("finished_at")
    )
    if dry_run:
        return PruneReport(old_events.count(), old_operations.count(), dry_run=True)
    events = _delete_in_batches(old_events)
    operations = _delete_in_batches(old_operations)
    return PruneReport(events, operations)
