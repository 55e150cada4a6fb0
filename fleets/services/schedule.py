"""The reconcile and retention schedule, kept in the database for Celery beat.

Beat runs django-celery-beat's DatabaseScheduler, so the schedule is rows an operator edits in
Django admin (Periodic tasks), not settings read once at start. This seeds the rows Haru needs
when they are missing: the reconcile of every fleet at HARU_RECONCILE_INTERVAL_MS (5 s when
unset) and the hourly history prune. An existing row is left as the operator set it, unless
`reset` asks to write the defaults back. A single fleet can get its own cadence with another
periodic task for `fleets.reconcile_fleet` whose argument is the fleet's id.
"""

from __future__ import annotations

import json
import math

from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

RECONCILE_TASK = "haru: reconcile every fleet"
PRUNE_TASK = "haru: prune old history"
DEFAULT_RECONCILE_MS = 5000
PRUNE_EVERY_S = 3600


# IntervalSchedule.every is a 32-bit integer column: microseconds reach only about 35 minutes.
_MAX_MICROSECONDS = 2**31 - 1


def _interval(*, milliseconds: int) -> IntervalSchedule:
    """Whole seconds when the interval has no fraction of one; microseconds otherwise (a
    reconcile every 500 ms is a normal setting)."""
    if milliseconds % 1000 == 0 or milliseconds * 1000 > _MAX_MICROSECONDS:
        every, period = max(1, round(milliseconds / 1000)), IntervalSchedule.SECONDS
    else:
        every, period = milliseconds * 1000, IntervalSchedule.MICROSECONDS
    schedule, _ = IntervalSchedule.objects.get_or_create(every=every, period=period)
    return schedule


def beat_schedule_seed(*, reconcile_interval_ms: int | None, reset: bool = False) -> list[str]:
    """Create (or with `reset`, overwrite) Haru's periodic tasks; return the names written."""
    reconcile_ms = reconcile_interval_ms or DEFAULT_RECONCILE_MS
    wanted = {
        RECONCILE_TASK: (
            "fleets.reconcile_all",
            reconcile_ms,
            # A tick queued for one interval is stale after it: an outage leaves no backlog.
            max(1, math.ceil(reconcile_ms / 1000)),
        ),
        PRUNE_TASK: ("fleets.prune_history", PRUNE_EVERY_S * 1000, PRUNE_EVERY_S),
    }
    written = []
    with transaction.atomic():
        for name, (task, milliseconds, expire_s) in wanted.items():
            if not reset and PeriodicTask.objects.filter(name=name).exists():
                continue
            PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": task,
                    "interval": _interval(milliseconds=milliseconds),
                    "crontab": None,
                    "args": json.dumps([]),
                    "expire_seconds": expire_s,
                    "enabled": True,
                },
            )
            written.append(name)
    return written
