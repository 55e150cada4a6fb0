"""Event retention: old history goes, the failover chart's promotions and in-flight work stay."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from fleets.base import clock
from fleets.dashboard.selectors import CHART_LIMIT, failover_chart
from fleets.models import Domain, Event, Operation
from fleets.services.retention import KEEP_PROMOTIONS, history_prune
from fleets.services.schedule import PRUNE_TASK

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def _operation(fleet, *, kind="promote", state="succeeded", age=40 * DAY, slug="west"):
    now = clock.now()
    target = Domain.objects.get(fleet=fleet, slug=slug)
    finished = now - age if state in ("succeeded", "failed", "cancelled") else None
    return Operation.objects.create(
        fleet=fleet,
        kind=kind,
        state=state,
        target_domain=target,
        target_domain_slug=slug,
        created_at=now - age - timedelta(seconds=5),
        started_at=now - age - timedelta(seconds=4),
        finished_at=finished,
    )


def _event(fleet, *, age, operation=None, step="", duration_ms=None):
    return Event.objects.create(
        fleet=fleet,
        kind="operation.step.done" if step else "domain.ready",
        operation=operation,
        step=step,
        duration_ms=duration_ms,
        created_at=clock.now() - age,
    )


def test_old_events_and_finished_operations_go_recent_ones_stay(seeded_fleet):
    old_demote = _operation(seeded_fleet, kind="demote", state="failed")
    old_event = _event(seeded_fleet, age=40 * DAY)
    recent_event = _event(seeded_fleet, age=DAY)
    recent_demote = _operation(seeded_fleet, kind="demote", state="succeeded", age=DAY)

    report = history_prune(older_than=clock.now() - 30 * DAY)

    assert (report.events, report.operations) == (1, 1)
    assert not Event.objects.filter(pk=old_event.pk).exists()
    assert not Operation.objects.filter(pk=old_demote.pk).exists()
    assert Event.objects.filter(pk=recent_event.pk).exists()
    assert Operation.objects.filter(pk=recent_demote.pk).exists()


def test_the_failover_charts_promotions_and_their_events_are_kept_whatever_their_age(
    seeded_fleet,
):
    promotions = [_operation(seeded_fleet, age=(100 - i) * DAY) for i in range(KEEP_PROMOTIONS + 2)]
    for op in promotions:
        _event(seeded_fleet, age=op_age(op), operation=op, step="wake", duration_ms=400)
    slugs = {d.id: d.slug for d in Domain.objects.filter(fleet=seeded_fleet)}
    before = failover_chart(seeded_fleet, slugs)

    history_prune(older_than=clock.now() - 30 * DAY)

    kept = set(Operation.objects.values_list("id", flat=True))
    assert kept == {op.id for op in promotions[2:]}  # the newest KEEP_PROMOTIONS
    assert Event.objects.filter(operation_id__in=kept).count() == KEEP_PROMOTIONS
    assert failover_chart(seeded_fleet, slugs) == before


def op_age(op) -> timedelta:
    return clock.now() - op.finished_at


def test_an_operation_in_flight_is_never_pruned(seeded_fleet):
    running = _operation(seeded_fleet, kind="demote", state="running", age=90 * DAY)
    its_event = _event(seeded_fleet, age=90 * DAY, operation=running, step="sleep")

    history_prune(older_than=clock.now() - 30 * DAY)

    assert Operation.objects.filter(pk=running.pk).exists()
    assert Event.objects.filter(pk=its_event.pk).exists()


def test_the_command_honours_days_and_dry_run(seeded_fleet):
    _event(seeded_fleet, age=10 * DAY)
    out = StringIO()
    call_command("prune_history", "--days", "7", "--dry-run", stdout=out)
    assert "would delete 1 event(s)" in out.getvalue()
    assert Event.objects.filter(created_at__lt=clock.now() - 7 * DAY).count() == 1

    call_command("prune_history", "--days", "7", stdout=out)
    assert "deleted 1 event(s)" in out.getvalue()
    assert not Event.objects.filter(created_at__lt=clock.now() - 7 * DAY).exists()


def test_retention_keeps_at_least_as_many_promotions_as_the_chart_shows():
    assert KEEP_PROMOTIONS >= CHART_LIMIT


def test_beat_schedules_the_prune():

    assert PeriodicTask.objects.get(name=PRUNE_TASK).task == "fleets.prune_history"
