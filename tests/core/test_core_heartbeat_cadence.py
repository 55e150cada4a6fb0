"""An idle fleet's heartbeats: when an unchanged beat records its sighting, when a standby is
asked, when GPU memory is read (fleets.core.heartbeat_cadence)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from fleets.core.beat_plan import BeatPlan, DomainMove
from fleets.core.heartbeat_cadence import (
    GPU_MEMORY_EVERY_MS,
    GPU_MEMORY_IDLE_EVERY_MS,
    gpu_read_due,
    record_due,
    record_every,
    sighting_dropped,
    standby_beat_due,
    standby_every,
)
from fleets.core.policy import Policy
from fleets.core.report import DomainReport, ModelReport, SlotReport, StatusReport

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = Policy.resolve({"heartbeatStaleMs": 30_000, "standbyHeartbeatMs": 20_000})


def ms(n: float) -> timedelta:
    return timedelta(milliseconds=n)


def test_an_unchanged_sighting_is_recorded_once_a_third_of_the_stale_window_has_gone():
    assert record_every(POLICY) == ms(10_000)
    assert not record_due(T0, T0 + ms(9_999), POLICY)
    assert record_due(T0, T0 + ms(10_000), POLICY)
    assert record_due(None, T0, POLICY)  # never recorded
    assert record_due(T0 + ms(5), T0, POLICY)  # a stored time ahead of ours: record


def test_a_healthy_standby_is_asked_at_most_every_third_of_the_stale_window():
    # standbyHeartbeatMs 20 s is capped at 30 s / 3: a dead standby reads stale in time.
    assert standby_every(POLICY) == ms(10_000)
    kwargs = {"healthy": True, "policy": POLICY}
    assert not standby_beat_due(last_seen_at=T0, now=T0 + ms(9_999), **kwargs)
    assert standby_beat_due(last_seen_at=T0, now=T0 + ms(10_000), **kwargs)
    assert standby_beat_due(last_seen_at=None, now=T0, **kwargs)


def test_a_standby_not_known_healthy_is_asked_every_tick():
    assert standby_beat_due(last_seen_at=T0, now=T0 + ms(1), healthy=False, policy=POLICY)


def test_standby_heartbeat_zero_asks_every_tick():
    every_tick = Policy.resolve({"standbyHeartbeatMs": 0})
    assert standby_beat_due(last_seen_at=T0, now=T0 + ms(1), healthy=True, policy=every_tick)


def test_gpu_memory_is_read_every_second_in_flight_and_once_a_minute_idle_with_a_record():
    assert gpu_read_due(T0, T0 + ms(GPU_MEMORY_EVERY_MS), in_flight=True, recording=False)
    assert not gpu_read_due(T0, T0 + ms(GPU_MEMORY_EVERY_MS), in_flight=False, recording=True)
    idle_due = T0 + ms(GPU_MEMORY_IDLE_EVERY_MS)
    assert gpu_read_due(T0, idle_due, in_flight=False, recording=True)
    assert not gpu_read_due(T0, idle_due, in_flight=False, recording=False)


STATUS = StatusReport(slots=(SlotReport(0, "inference", (ModelReport("a", False),)),), ready=True)


def seen_plan(observed: datetime) -> BeatPlan:
    return BeatPlan(
        domain_id="d", fleet_id="f", observed_at=observed, now=observed, seen=DomainReport(STATUS)
    )


def stored_as(plan: BeatPlan) -> dict:
    assert plan.seen is not None
    return {**plan.seen.to_json(), "heartbeat": {"ok": True, "checkedAt": "2026-01-01T00:00:00Z"}}


def test_an_unchanged_recent_sighting_is_dropped():
    plan = seen_plan(T0 + ms(1_000))
    kept = sighting_dropped(
        plan, stored_report=stored_as(plan), failing=False, last_seen_at=T0, policy=POLICY
    )
    assert kept.seen is None


def test_a_sighting_is_kept_when_it_is_news():
    plan = seen_plan(T0 + ms(1_000))
    stored = stored_as(plan)
    base = {"stored_report": stored, "failing": False, "last_seen_at": T0, "policy": POLICY}
    # Recovery from a failing heartbeat.
    assert sighting_dropped(plan, **{**base, "failing": True}).seen is not None
    # A report that differs from the stored one.
    assert sighting_dropped(plan, **{**base, "stored_report": {"slots": []}}).seen is not None
    # The stored sighting is due for a record.
    assert sighting_dropped(plan, **{**base, "last_seen_at": T0 - ms(10_000)}).seen is not None
    # The beat moves a row.
    moving = replace(plan, domain=DomainMove("degraded", "ready", "heartbeat healthy"))
    assert sighting_dropped(moving, **base).seen is not None
