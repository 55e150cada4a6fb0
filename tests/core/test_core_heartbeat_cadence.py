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
    report_changed,
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


def test_gpu_memory_is_read_every_second_in_flight_and_once_a_minute_idle():
    assert gpu_read_due(T0, T0 + ms(GPU_MEMORY_EVERY_MS), in_flight=True)
    assert not gpu_read_due(T0, T0 + ms(GPU_MEMORY_EVERY_MS), in_flight=False)
    assert not gpu_read_due(T0, T0 + ms(GPU_MEMORY_IDLE_EVERY_MS - 1), in_flight=False)
    assert gpu_read_due(T0, T0 + ms(GPU_MEMORY_IDLE_EVERY_MS), in_flight=False)
    assert gpu_read_due(None, T0, in_flight=False)  # never read


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


def test_a_sighting_kept_on_the_lease_is_never_recorded_for_its_age_alone():
    plan = seen_plan(T0 + ms(60_000))
    stored = stored_as(plan)
    base = {"stored_report": stored, "failing": False, "policy": POLICY, "kept_elsewhere": True}
    # However old the row's sighting: the lease's give-back keeps it, the row is not written.
    assert sighting_dropped(plan, **base, last_seen_at=T0).seen is None
    assert sighting_dropped(plan, **base, last_seen_at=None).seen is None
    # News is still written.
    assert sighting_dropped(plan, **{**base, "failing": True}, last_seen_at=T0).seen is not None
    assert (
        sighting_dropped(plan, **{**base, "stored_report": {"slots": []}}, last_seen_at=T0).seen
        is not None
    )


def _with_gpus(plan: BeatPlan, used_mib: float, at: str) -> dict:
    assert plan.seen is not None
    return {
        **plan.seen.to_json(),
        "gpus": [{"index": 0, "usedMib": used_mib, "totalMib": 80_000}],
        "gpusAt": at,
    }


def test_a_gpu_memory_reading_is_news_only_when_the_memory_differs():
    stored = _with_gpus(seen_plan(T0), 1_000, "2026-01-01T00:00:00Z")
    same_later = _with_gpus(seen_plan(T0), 1_000, "2026-01-01T00:01:00Z")
    changed = _with_gpus(seen_plan(T0), 2_000, "2026-01-01T00:01:00Z")
    assert not report_changed({**stored, "heartbeat": {"ok": True}}, same_later)
    assert report_changed(stored, changed)
    assert report_changed({k: v for k, v in stored.items() if k != "gpus"}, same_later)
