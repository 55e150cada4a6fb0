"""Heartbeat records: the scheduling columns are written only by guarded updates.

A heartbeat is read over HTTP before it is recorded, so a slow tick can finish after a faster
one; whatever it recorded must never overwrite newer news, for a failure as for a success.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleets.models import Domain, Event, Fleet
from fleets.services.heartbeats import domain_heartbeat_failed, domain_seen

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ERROR = {"kind": "network", "status": None, "message": "connection refused"}


def west(fleet: Fleet) -> Domain:
    return Domain.objects.get(fleet=fleet, slug="west")


def seen(domain: Domain, at: datetime, **report) -> bool:
    return domain_seen(
        domain_id=domain.id, fleet_id=domain.fleet_id, seen_at=at, report={"ready": True, **report}
    )


def failed(domain: Domain, at: datetime) -> bool:
    return domain_heartbeat_failed(
        domain_id=domain.id, fleet_id=domain.fleet_id, checked_at=at, error=ERROR
    )


def events(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind).order_by("id"))


def test_a_failure_taken_before_the_last_success_writes_nothing(seeded_fleet):
    d = west(seeded_fleet)
    assert seen(d, T0 + timedelta(seconds=2), marker="newer")
    assert failed(d, T0 + timedelta(seconds=1)) is False  # older news, from a slower tick
    d.refresh_from_db()
    assert d.heartbeat_failing_since is None
    assert d.heartbeat_checked_at == T0 + timedelta(seconds=2)
    assert d.last_report["heartbeat"]["ok"] is True
    assert d.last_report["marker"] == "newer"
    assert events("domain.heartbeat.failed") == []


def test_a_failure_taken_before_the_last_failure_writes_nothing(seeded_fleet):
    d = west(seeded_fleet)
    assert failed(d, T0 + timedelta(seconds=2)) is True
    assert failed(d, T0 + timedelta(seconds=1)) is False
    d.refresh_from_db()
    assert d.heartbeat_checked_at == T0 + timedelta(seconds=2)
    assert d.heartbeat_failing_since == T0 + timedelta(seconds=2)


def test_a_success_taken_before_the_last_failure_writes_nothing(seeded_fleet):
    d = west(seeded_fleet)
    assert failed(d, T0 + timedelta(seconds=2)) is True
    # A slower tick's success, observed before the failure, recorded after it: older news.
    assert seen(d, T0 + timedelta(seconds=1), marker="older") is False
    d.refresh_from_db()
    assert d.heartbeat_failing_since == T0 + timedelta(seconds=2)
    assert d.heartbeat_checked_at == T0 + timedelta(seconds=2)
    assert d.last_seen_at is None or d.last_seen_at < T0 + timedelta(seconds=1)
    assert d.last_report["heartbeat"]["ok"] is False
    assert "marker" not in d.last_report
    assert events("domain.heartbeat.recovered") == []


def test_a_success_taken_at_the_instant_of_the_last_failure_wins(seeded_fleet):
    d = west(seeded_fleet)
    assert failed(d, T0) is True
    assert seen(d, T0) is True
    assert failed(d, T0) is False  # and the failure, recorded again, does not undo it
    d.refresh_from_db()
    assert d.heartbeat_failing_since is None
    assert len(events("domain.heartbeat.recovered")) == 1


def test_failing_is_edge_triggered_and_recovery_reports_since_when(seeded_fleet):
    d = west(seeded_fleet)
    assert failed(d, T0) is True
    assert failed(d, T0 + timedelta(seconds=1)) is False  # still failing: recorded, no event
    d.refresh_from_db()
    assert d.heartbeat_failing_since == T0
    assert d.heartbeat_checked_at == T0 + timedelta(seconds=1)
    assert d.last_report["heartbeat"]["failingSince"] == "2026-01-01T00:00:00Z"
    assert len(events("domain.heartbeat.failed")) == 1

    assert seen(d, T0 + timedelta(seconds=2)) is True
    d.refresh_from_db()
    assert d.heartbeat_failing_since is None
    assert d.last_seen_at == T0 + timedelta(seconds=2)
    [recovered] = events("domain.heartbeat.recovered")
    assert recovered.data == {"failingSince": "2026-01-01T00:00:00Z"}


def test_the_failure_keeps_the_reported_display_data_it_did_not_replace(seeded_fleet):
    d = west(seeded_fleet)
    assert seen(d, T0, gpus=[{"index": 0}])
    assert failed(d, T0 + timedelta(seconds=1))
    d.refresh_from_db()
    assert d.last_report["gpus"] == [{"index": 0}]
    assert d.last_report["heartbeat"]["error"] == ERROR


def test_the_gpu_read_time_moves_only_with_a_recorded_answer(seeded_fleet):
    d = west(seeded_fleet)
    asked = T0 - timedelta(milliseconds=300)
    assert domain_seen(
        domain_id=d.id, fleet_id=d.fleet_id, seen_at=T0, report={}, gpus_read_at=asked
    )
    assert seen(d, T0 + timedelta(seconds=1))  # no answer this beat: the time stays
    d.refresh_from_db()
    assert d.gpus_read_at == asked


def test_the_gpu_read_time_never_moves_back_to_an_answer_asked_earlier(seeded_fleet):
    d = west(seeded_fleet)
    later = T0 - timedelta(milliseconds=100)
    earlier = T0 - timedelta(milliseconds=900)
    assert domain_seen(
        domain_id=d.id, fleet_id=d.fleet_id, seen_at=T0, report={}, gpus_read_at=later
    )
    # Another process's read, asked earlier, carried by a newer beat: the beat is recorded,
    # the read time stays.
    assert domain_seen(
        domain_id=d.id,
        fleet_id=d.fleet_id,
        seen_at=T0 + timedelta(seconds=1),
        report={},
        gpus_read_at=earlier,
    )
    d.refresh_from_db()
    assert d.last_seen_at == T0 + timedelta(seconds=1)
    assert d.gpus_read_at == later
