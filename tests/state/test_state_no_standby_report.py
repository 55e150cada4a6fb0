"""The no-viable-standby report is rate-limited in the database, so every process ticking a
fleet (server loop, Celery workers) shares one limit instead of each keeping its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleets.models import Event, Fleet
from fleets.services.escalation import fleet_no_standby_clear, fleet_no_standby_report

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY_MS = 60_000


def report(fleet: Fleet, at: datetime) -> bool:
    return fleet_no_standby_report(
        fleet_id=fleet.id,
        active_domain_id=fleet.active_domain_id,
        now=at,
        every_ms=EVERY_MS,
        reason="no_viable_standby",
    )


def reports() -> int:
    return Event.objects.filter(kind="failover.no_viable_standby").count()


def test_one_report_per_interval_whoever_ticks(seeded_fleet):
    assert report(seeded_fleet, T0) is True
    # A second process (nothing in its memory) a moment later: the database says "reported".
    assert report(Fleet.objects.get(pk=seeded_fleet.pk), T0 + timedelta(seconds=1)) is False
    assert reports() == 1
    assert report(seeded_fleet, T0 + timedelta(milliseconds=EVERY_MS)) is True
    assert reports() == 2


def test_a_recovered_fleet_reports_the_next_loss_at_once(seeded_fleet):
    assert report(seeded_fleet, T0)
    fleet_no_standby_clear(fleet_id=seeded_fleet.id)
    assert Fleet.objects.get(pk=seeded_fleet.pk).no_standby_reported_at is None
    assert report(seeded_fleet, T0 + timedelta(seconds=1)) is True
    assert reports() == 2


def test_the_report_names_the_lost_active(seeded_fleet):
    report(seeded_fleet, T0)
    event = Event.objects.get(kind="failover.no_viable_standby")
    assert event.domain_id == seeded_fleet.active_domain_id
    assert event.data == {"reason": "no_viable_standby"}
