"""Recovery samples and their published quantiles."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.outage import during_outage
from fleets.core.recovery import (
    Detection,
    detection_of,
    over_objective,
    percentile,
    sample,
    summarize,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DRILL_STEPS = {"stop_training": 500, "verify_gpu": 20, "wake": 900, "probe": 80}


def test_a_drill_sample_is_detection_plus_the_failover_path_before_the_switch():
    s = sample("drill", T0, {**DRILL_STEPS, "sleep": 400, "start_training": 300}, 3000)
    assert s is not None
    assert s.total_ms == 3000 + 1500  # sleep and training restart are not recovery
    assert s.to_json()["stepsMs"] == DRILL_STEPS


def test_a_sample_missing_a_step_of_the_path_is_left_out_rather_than_understated():
    assert sample("drill", T0, {"wake": 900}, 3000) is None
    assert sample("failover", T0, DRILL_STEPS, 3000) is None  # no switch_route recorded


def test_p50_and_p95_cover_the_newest_window_only():
    samples = [
        sample("drill", T0 + timedelta(minutes=i), {**DRILL_STEPS, "wake": 900 + i * 100}, 0)
        for i in range(30)
    ]
    summary = summarize("drill", [s for s in samples if s], window=20)
    assert summary.count == 20
    # Newest 20: i = 10..29, totals 2500..4400 by 100.
    assert summary.p50_ms == 3400 and summary.p95_ms == 4300
    assert summary.last is not None and summary.last.finished_at == T0 + timedelta(minutes=29)
    assert over_objective(summary, 4000) and not over_objective(summary, 4300)
    assert summarize("failover", [s for s in samples if s]).p95_ms is None


def test_nearest_rank_percentile():
    assert percentile([5, 1, 3], 0.5) == 3
    assert percentile([1.0], 0.95) == 1.0


def test_a_failovers_detection_is_measured_from_its_recorded_outage_start():
    started = T0 + timedelta(seconds=10)
    # Only the supervisor died: its last good heartbeat (T0+2) came before the model servers
    # were last seen serving, which the outage's start (detected_at, T0+6) already weighed.
    # Clients were served until then: the heartbeat does not move the start earlier (it did,
    # and the recovery time read seven times the failover figure).
    assert detection_of(
        "failover",
        started_at=started,
        detected_at=T0 + timedelta(seconds=6),
        source_seen_at=T0 + timedelta(seconds=2),
        bound_ms=3000,
    ) == (4000, Detection.MEASURED)
    # A detected_at that names an earlier start (a failed request) is kept as it is.
    assert detection_of(
        "failover",
        started_at=started,
        detected_at=T0,
        source_seen_at=T0 + timedelta(seconds=2),
        bound_ms=3000,
    ) == (10_000, Detection.MEASURED)
    # An operation recorded before its start was kept: the last good heartbeat stands in.
    assert detection_of(
        "failover", started_at=started, detected_at=None, source_seen_at=T0, bound_ms=3000
    ) == (10_000, Detection.MEASURED)


def test_a_failovers_total_is_its_figure_whatever_its_parts_add_up_to():
    steps = {**DRILL_STEPS, "switch_route": 5}
    s = sample("failover", T0, steps, 4000, Detection.MEASURED, failover_ms=9000)
    assert s is not None and s.total_ms == 9000 and s.to_json()["totalMs"] == 9000
    assert s.detection_ms == 4000 and dict(s.steps_ms) == steps
    # Without a figure (a bound detection), the parts are the total; a drill never has one.
    assert sample("failover", T0, steps, 4000).total_ms == 4000 + 1505
    drill = sample("drill", T0, DRILL_STEPS, 0, Detection.NONE, failover_ms=9000)
    assert drill is not None and drill.total_ms == 1500


def test_detection_falls_back_to_its_bound_only_without_marks_and_a_drill_has_none():
    assert detection_of(
        "failover", started_at=T0, detected_at=None, source_seen_at=None, bound_ms=3000
    ) == (3000, Detection.BOUND)
    assert detection_of(
        "drill", started_at=T0, detected_at=T0, source_seen_at=T0, bound_ms=3000
    ) == (0, Detection.NONE)
    s = sample("failover", T0, {**DRILL_STEPS, "switch_route": 5}, 3000, Detection.BOUND)
    assert s is not None and s.to_json()["detection"] == "bound"


def test_a_round_trip_drill_counts_its_switch():
    s = sample("drill", T0, {**DRILL_STEPS, "switch_route": 7, "back_wake": 900}, 0, Detection.NONE)
    assert s is not None and s.steps_ms["switch_route"] == 7 and "back_wake" not in s.steps_ms
    assert s.total_ms == 1500 + 7


@pytest.mark.parametrize(
    ("kind", "detected", "source_state", "outage"),
    [
        ("promote", True, "ready", True),  # an automatic failover carries its outage's start
        ("promote", False, "failed", True),  # an operator moving away from a failed active
        ("promote", False, "ready", False),  # a planned promotion
        ("promote", False, "degraded", False),
        ("promote", False, None, False),  # no active to move away from
        ("drill", True, "failed", False),  # a drill is never an outage
        ("demote", False, "failed", False),
    ],
)
def test_during_outage(kind, detected, source_state, outage):
    at = T0 if detected else None
    assert during_outage(kind=kind, detected_at=at, source_state=source_state) is outage
