"""One timestamp spelling for every JSON body: RFC 3339, UTC, Z."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fleets.base import clock
from fleets.core.readiness import Readiness, ReadinessVerdict
from fleets.core.recovery import RecoveryKind, RecoverySample
from fleets.core.timestamps import utc_iso

AT = datetime(2026, 1, 1, 0, 10, 0, 123456, tzinfo=UTC)


def test_a_utc_time_is_spelled_with_z_and_its_microseconds():
    assert utc_iso(AT) == "2026-01-01T00:10:00.123456Z"


def test_a_whole_second_has_no_fraction():
    assert utc_iso(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00Z"


def test_another_zone_is_converted_to_utc():
    tokyo = datetime(2026, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=9)))
    assert utc_iso(tokyo) == "2026-01-01T00:00:00Z"


def test_a_naive_time_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        utc_iso(datetime(2026, 1, 1))


def test_the_clock_and_the_core_spell_a_time_alike():
    assert clock.iso(AT) == utc_iso(AT)
    assert clock.iso(None) is None


def test_readiness_and_recovery_bodies_use_the_one_spelling():
    readiness = Readiness(ReadinessVerdict.READY, "west", (), AT).to_json()
    assert readiness["evaluatedAt"] == "2026-01-01T00:10:00.123456Z"
    drill = RecoverySample(RecoveryKind.DRILL, AT, 0, {}).to_json()
    assert drill["finishedAt"] == "2026-01-01T00:10:00.123456Z"
    # Each parses back as the same instant.
    assert datetime.fromisoformat(readiness["evaluatedAt"]) == AT
