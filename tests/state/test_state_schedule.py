"""Beat's schedule lives in the database: seeded after migrate, edits survive, --reset restores."""

from __future__ import annotations

from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from fleets.services.schedule import PRUNE_TASK, RECONCILE_TASK, beat_schedule_seed

pytestmark = pytest.mark.django_db


def _every_ms(name: str) -> float:
    interval = PeriodicTask.objects.select_related("interval").get(name=name).interval
    per = {IntervalSchedule.SECONDS: 1000, IntervalSchedule.MICROSECONDS: 0.001}[interval.period]
    return interval.every * per


def test_migrate_seeds_the_reconcile_and_prune_tasks():
    # The test database was created by `migrate`, which sent post_migrate.
    reconcile = PeriodicTask.objects.get(name=RECONCILE_TASK)
    assert reconcile.task == "fleets.reconcile_all" and reconcile.enabled
    expected_ms = settings.HARU["reconcile_interval_ms"] or 5000
    assert _every_ms(RECONCILE_TASK) == expected_ms
    assert PeriodicTask.objects.get(name=PRUNE_TASK).task == "fleets.prune_history"
    assert _every_ms(PRUNE_TASK) == 3600 * 1000


def test_an_interval_edited_in_admin_survives_seeding_and_reset_restores_it():
    edited, _ = IntervalSchedule.objects.get_or_create(
        every=250_000, period=IntervalSchedule.MICROSECONDS
    )  # 250 ms
    PeriodicTask.objects.filter(name=RECONCILE_TASK).update(interval=edited)

    assert beat_schedule_seed(reconcile_interval_ms=2000) == []
    assert _every_ms(RECONCILE_TASK) == 250

    out = StringIO()
    call_command("seed_schedule", "--reset", stdout=out)
    assert RECONCILE_TASK in out.getvalue()
    assert _every_ms(RECONCILE_TASK) == (settings.HARU["reconcile_interval_ms"] or 5000)


def test_a_sub_second_interval_is_kept_exactly():
    PeriodicTask.objects.filter(name=RECONCILE_TASK).delete()
    assert beat_schedule_seed(reconcile_interval_ms=500) == [RECONCILE_TASK]
    assert _every_ms(RECONCILE_TASK) == 500
    assert PeriodicTask.objects.get(name=RECONCILE_TASK).expire_seconds == 1


def test_beat_uses_the_database_scheduler_and_declares_nothing_it_would_overwrite():
    assert settings.CELERY_BEAT_SCHEDULER == "django_celery_beat.schedulers:DatabaseScheduler"
    assert settings.CELERY_BEAT_SCHEDULE == {}
