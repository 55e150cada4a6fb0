"""Per-arm stats: recorded per process, stored once a second, summed across processes by the
reader; a store that fails drops samples and counts them, never touching traffic."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connections

from fleets.core import latency_histogram as hist
from fleets.core.arm_stats import Arm, ArmWindow
from fleets.metrics import arms as arm_metrics
from fleets.models import ArmSample
from fleets.proxy import arm_stats
from fleets.proxy.arm_stats import ArmRecorder
from fleets.reads.arm_stats import arm_windows
from fleets.services import arm_samples
from fleets.services.arm_samples import ArmSampleRow, arm_samples_write

ROLLOUT = str(uuid.uuid4())
T0 = 1_800_000_000.0  # a fixed "now" for the recorders' clocks
SINCE = datetime.fromtimestamp(T0 - 60, UTC)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _metric(metric, *labels) -> float:
    family = next(iter(metric.collect()))
    for sample in family.samples:
        if sample.name.endswith("_total") and tuple(sample.labels.values()) == labels:
            return sample.value
    return 0.0


@pytest.mark.django_db
def test_two_recorders_are_summed_by_the_reader():
    clock = Clock()
    one, two = ArmRecorder(now=clock, autostart=False), ArmRecorder(now=clock, autostart=False)
    for ms in range(1, 51):
        one.record(
            fleet="demo", rollout_id=ROLLOUT, model="m", arm="stable", ok=True, ttft_s=ms / 1000
        )
    for ms in range(51, 101):
        two.record(
            fleet="demo", rollout_id=ROLLOUT, model="m", arm="stable", ok=True, ttft_s=ms / 1000
        )
    clock.now += 1  # the next second: another row
    for i in range(10):
        two.record(
            fleet="demo",
            rollout_id=ROLLOUT,
            model="m",
            arm="candidate",
            ok=i < 8,
            ttft_s=0.2 if i < 8 else None,
            gaps_s=[0.02, 0.04] if i < 8 else (),
        )
    assert one.flush() == 1
    assert two.flush() == 2
    windows = arm_windows(rollout_id=ROLLOUT, model="m", since=SINCE)
    stable, candidate = windows[Arm.STABLE], windows[Arm.CANDIDATE]
    assert (stable.requests, stable.errors, stable.ttft_samples) == (100, 0, 100)
    # Percentiles from the summed histograms: the exact value, at most one bucket (19 %) above.
    assert stable.ttft_p50_ms is not None and 50 <= stable.ttft_p50_ms <= 50 * hist.FACTOR
    assert stable.ttft_p95_ms is not None and 95 <= stable.ttft_p95_ms <= 95 * hist.FACTOR
    assert stable.ttft_p99_ms is not None and 99 <= stable.ttft_p99_ms <= 99 * hist.FACTOR
    assert stable.itl_samples == 0 and stable.itl_p50_ms is None
    assert (candidate.requests, candidate.errors, candidate.error_rate) == (10, 2, 0.2)
    assert candidate.ttft_samples == 8 and 200 <= candidate.ttft_p50_ms <= 200 * hist.FACTOR
    assert candidate.itl_samples == 16
    assert 20 <= candidate.itl_p50_ms <= 20 * hist.FACTOR
    assert 40 <= candidate.itl_p99_ms <= 40 * hist.FACTOR
    # Nothing left to flush: nothing written twice.
    assert one.flush() == 0 and two.flush() == 0
    assert ArmSample.objects.count() == 3


@pytest.mark.django_db
def test_the_reader_answers_both_arms_and_keeps_to_its_window():
    assert arm_windows(rollout_id=ROLLOUT, model="m", since=SINCE) == {
        Arm.STABLE: ArmWindow(),
        Arm.CANDIDATE: ArmWindow(),
    }
    clock = Clock()
    recorder = ArmRecorder(now=clock, autostart=False)
    for second in range(5):
        clock.now = T0 + second
        recorder.record(fleet="f", rollout_id=ROLLOUT, model="m", arm="candidate", ok=True)
    recorder.flush()
    start = datetime.fromtimestamp(T0, UTC)
    window = arm_windows(
        rollout_id=ROLLOUT,
        model="m",
        since=start + timedelta(seconds=1),
        until=start + timedelta(seconds=3),
    )
    assert window[Arm.CANDIDATE].requests == 2
    assert window[Arm.STABLE] == ArmWindow()
    other = arm_windows(rollout_id=str(uuid.uuid4()), model="m", since=SINCE)
    assert other[Arm.CANDIDATE] == ArmWindow()


@pytest.mark.django_db
def test_a_failing_store_drops_the_samples_and_counts_them():
    def refuse(rows, now):
        raise OperationalError("connection refused")

    recorder = ArmRecorder(write=refuse, autostart=False)
    before = _metric(arm_metrics.SAMPLES_DROPPED, "store")
    for _ in range(7):
        recorder.record(fleet="f", rollout_id=ROLLOUT, model="m", arm="stable", ok=True)
    assert recorder.flush() == 0
    assert recorder.dropped == 7
    assert _metric(arm_metrics.SAMPLES_DROPPED, "store") == before + 7
    # Dropped, not kept for later: the next flush has nothing of them.
    assert recorder.take() == {}
    # The per-arm series were still written: the process's own view survives the outage.
    assert _metric(arm_metrics.ARM_REQUESTS, "f", "m", "stable") >= 7


def _flushed_by_its_thread(recorder: ArmRecorder) -> None:
    """Start the recorder's own thread and stop it: it flushes once more as it stops, on its
    own connection, as in a proxy process."""
    recorder.start()
    recorder.stop()


@pytest.mark.django_db(transaction=True)
def test_a_real_store_outage_drops_samples_and_the_next_flush_stores_again():
    recorder = ArmRecorder(autostart=False)
    settings_dict = connections["default"].settings_dict
    saved = dict(settings_dict)
    if connections["default"].vendor == "postgresql":
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", "1"
    else:
        settings_dict["NAME"] = "/nonexistent-haru-dir/state.sqlite3"
    try:
        recorder.record(fleet="f", rollout_id=ROLLOUT, model="m", arm="stable", ok=True)
        _flushed_by_its_thread(recorder)  # never raises
        assert (recorder.dropped, recorder.stored) == (1, 0)
    finally:
        settings_dict.update(saved)
    recorder.record(fleet="f", rollout_id=ROLLOUT, model="m", arm="stable", ok=False)
    _flushed_by_its_thread(recorder)
    assert (recorder.dropped, recorder.stored) == (1, 1)
    window = arm_windows(rollout_id=ROLLOUT, model="m", since=SINCE - timedelta(days=3650))
    assert (window[Arm.STABLE].requests, window[Arm.STABLE].errors) == (1, 1)


def test_pending_windows_are_bounded(monkeypatch):
    monkeypatch.setattr(arm_stats, "MAX_WINDOWS", 3)
    clock = Clock()
    recorder = ArmRecorder(now=clock, write=lambda rows, now: None, autostart=False)
    for second in range(5):
        clock.now = T0 + second
        recorder.record(fleet="f", rollout_id=ROLLOUT, model="m", arm="stable", ok=True)
    assert len(recorder.take()) == 3
    assert recorder.dropped == 2


@pytest.mark.django_db
def test_a_write_deletes_expired_rows_a_bounded_batch_at_a_time(monkeypatch):
    monkeypatch.setattr(arm_samples, "DELETE_BATCH", 4)
    now = datetime.fromtimestamp(T0, UTC)
    old = now - arm_samples.RETENTION - timedelta(seconds=1)

    def row(at: datetime) -> ArmSampleRow:
        return ArmSampleRow(ROLLOUT, "m", "stable", at, 1, 0, [], [])

    arm_samples_write(
        [row(old - timedelta(seconds=i)) for i in range(6)], now=now - timedelta(days=1)
    )
    assert ArmSample.objects.count() == 6
    assert arm_samples_write([row(now)], now=now) == 4
    assert ArmSample.objects.count() == 3
    assert arm_samples_write([row(now)], now=now) == 2
    assert ArmSample.objects.filter(window_start__lt=now - arm_samples.RETENTION).count() == 0
    with pytest.raises(ValueError, match="at most"):
        arm_samples_write([row(now)] * (arm_samples.MAX_ROWS + 1), now=now)


def test_the_log_buckets_bound_their_percentiles():
    assert hist.bucket_of(0) == 0 and hist.bucket_of(float("nan")) == 0
    assert hist.bucket_of(10**9) == hist.BUCKETS - 1
    for ms in (0.6, 1, 7.3, 80, 1234, 60_000):
        bucket = hist.bucket_of(ms)
        assert hist.upper_ms(bucket) >= ms
        assert bucket == 0 or hist.upper_ms(bucket - 1) < ms
    counts = hist.counts_of([10.0] * 90 + [1000.0] * 10)
    assert hist.percentile(counts, 0.5) == hist.upper_ms(hist.bucket_of(10))
    assert hist.percentile(counts, 0.95) == hist.upper_ms(hist.bucket_of(1000))
    assert hist.percentile({}, 0.5) is None
    merged: dict[int, int] = {}
    hist.merge(merged, hist.sparse(counts))
    hist.merge(merged, [[1, 2], ["x", 1], [999, 1], [3, -1], "junk"])  # junk skipped
    assert merged == {**counts, 1: counts.get(1, 0) + 2}
