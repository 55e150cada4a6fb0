"""Storing the proxies' per-arm samples, and keeping the table bounded.

Telemetry, not routing state: rows are only ever appended (one per rollout, model, arm and
second per proxy process) and deleted by age, so no compare-and-swap guards them. Each write
also deletes at most DELETE_BATCH rows older than the retention, oldest first, so the table
stays bounded by (proxy processes x split arms x retention seconds) without a job of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from fleets.models import ArmSample

# Long enough for any gate's window and an operator's look back at a step; short enough that
# the table stays small (see the module docstring).
RETENTION = timedelta(hours=6)
DELETE_BATCH = 5000
# Rows one write may insert: a process has at most this many (rollout, model, arm, second)
# windows pending (fleets/proxy/arm_stats.py bounds them).
MAX_ROWS = 4096


@dataclass(frozen=True)
class ArmSampleRow:
    rollout_id: str
    model: str
    arm: str
    window_start: datetime
    requests: int
    errors: int
    ttft: list[list[int]]
    itl: list[list[int]]


def arm_samples_write(rows: Sequence[ArmSampleRow], *, now: datetime) -> int:
    """Insert `rows` (at most MAX_ROWS) and delete a bounded batch of expired ones; return how
    many rows were deleted."""
    if len(rows) > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS} arm sample rows per write")
    with transaction.atomic():
        ArmSample.objects.bulk_create(
            [
                ArmSample(
                    rollout_id=row.rollout_id,
                    model=row.model[:200],
                    arm=row.arm,
                    window_start=row.window_start,
                    requests=row.requests,
                    errors=row.errors,
                    ttft=row.ttft,
                    itl=row.itl,
                )
                for row in rows
            ]
        )
    expired = list(
        ArmSample.objects.filter(window_start__lt=now - RETENTION)
        .order_by("window_start")
        .values_list("pk", flat=True)[:DELETE_BATCH]
    )
    if not expired:
        return 0
    deleted, _ = ArmSample.objects.filter(pk__in=expired).delete()
    return deleted
