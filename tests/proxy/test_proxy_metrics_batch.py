"""The proxy's metrics are written in batches: what a flush writes is what observing each
request one by one would have written, and nothing is lost or written twice."""

from __future__ import annotations

import asyncio
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from fleets.metrics import requests as request_metrics


def _samples(*collectors) -> dict[tuple[str, tuple], float]:
    out = {}
    for collector in collectors:
        for family in collector.collect():
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _ours() -> dict[tuple[str, tuple], float]:
    return _samples(
        request_metrics.REQUESTS,
        request_metrics.TTFB,
        request_metrics.OVERHEAD,
        request_metrics.STALE,
    )


# Every bucket edge, values just either side of one, zero and past the last bound.
AMOUNTS = [0.0, 0.0001, 0.00010001, 0.00025, 0.0007, 0.001, 0.003, 0.01, 0.5, 1, 2, 59.9, 60, 61]


def _expected_after(requests) -> dict[tuple[str, tuple], float]:
    """The same observations made one by one on fresh metrics of the same shape."""
    registry = CollectorRegistry()
    requests_c = Counter(
        "haru_proxy_requests", "", ["fleet", "model", "outcome"], registry=registry
    )
    ttfb = Histogram(
        "haru_proxy_ttfb_seconds",
        "",
        ["fleet"],
        buckets=request_metrics.TTFB._upper_bounds[:-1],
        registry=registry,
    )
    overhead = Histogram(
        "haru_proxy_overhead_seconds",
        "",
        buckets=request_metrics.OVERHEAD._upper_bounds[:-1],
        registry=registry,
    )
    stale = Counter("haru_proxy_stale_routing", "", ["fleet"], registry=registry)
    for fleet, model, outcome, overhead_s, ttfb_s, is_stale in requests:
        requests_c.labels(fleet, model, outcome).inc()
        if overhead_s is not None:
            overhead.observe(overhead_s)
        if ttfb_s is not None:
            ttfb.labels(fleet).observe(ttfb_s)
        if is_stale:
            stale.labels(fleet).inc()
    return _samples(requests_c, ttfb, overhead, stale)


def _delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _requests():
    out = []
    for i, amount in enumerate(AMOUNTS):
        fleet = "batch-a" if i % 2 else "batch-b"
        out.append((fleet, "m", "ok", amount, AMOUNTS[-1 - i], i % 3 == 0))
        out.append((fleet, "", "model_not_found", None, amount, False))
    return out


def _record(requests):
    for fleet, model, outcome, overhead_s, ttfb_s, stale in requests:
        request_metrics.record(
            fleet=fleet,
            model=model,
            outcome=outcome,
            overhead_s=overhead_s,
            ttfb_s=ttfb_s,
            stale=stale,
        )


def test_records_in_a_loop_are_written_by_a_flush_as_one_by_one_observing_would():
    request_metrics.flush()
    before = _ours()
    requests = _requests()

    async def serve():
        _record(requests)
        # Pending, not yet written: a scrape of another process would not see them yet.
        assert _delta(before, _ours()) == {}

    asyncio.run(serve())
    request_metrics.flush()
    expected = {k: v for k, v in _expected_after(requests).items() if v}
    got = _delta(before, _ours())
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    request_metrics.flush()  # nothing twice
    assert _delta(before, _ours()) == got


def test_the_loop_flushes_within_the_bound_without_another_request():
    request_metrics.flush()
    before = _ours()

    async def serve():
        _record([("batch-timer", "m", "ok", 0.001, 0.002, False)])
        await asyncio.sleep(request_metrics.FLUSH_S * 2)
        return _delta(before, _ours())

    written = asyncio.run(serve())
    key = (
        "haru_proxy_requests_total",
        (("fleet", "batch-timer"), ("model", "m"), ("outcome", "ok")),
    )
    assert written[key] == 1


def test_outside_a_loop_each_record_is_written_at_once():
    request_metrics.flush()
    before = _ours()
    _record([("batch-sync", "m", "ok", None, None, False)])
    key = (
        "haru_proxy_requests_total",
        (("fleet", "batch-sync"), ("model", "m"), ("outcome", "ok")),
    )
    assert _delta(before, _ours()) == {key: 1}


def test_a_timer_left_on_a_closed_loop_does_not_strand_later_records():
    request_metrics.flush()
    before = _ours()

    async def one(fleet):
        _record([(fleet, "m", "ok", None, None, False)])

    asyncio.run(one("batch-loop-1"))  # its timer dies with its loop

    async def two():
        await one("batch-loop-2")
        await asyncio.sleep(request_metrics.FLUSH_S * 2)

    asyncio.run(two())
    written = _delta(before, _ours())
    assert {k[1][0][1] for k in written} == {"batch-loop-1", "batch-loop-2"}


def test_a_loop_too_busy_for_its_timer_flushes_once_the_queue_is_full(monkeypatch):
    request_metrics.flush()
    monkeypatch.setattr(request_metrics, "MAX_QUEUED", 5)
    before = _ours()
    key = (
        "haru_proxy_requests_total",
        (("fleet", "batch-full"), ("model", "m"), ("outcome", "ok")),
    )

    async def serve():
        _record([("batch-full", "m", "ok", None, None, False)] * 4)
        assert _delta(before, _ours()) == {}  # queued
        _record([("batch-full", "m", "ok", None, None, False)])
        return _delta(before, _ours())  # the fifth filled the queue: written, no await

    assert asyncio.run(serve()) == {key: 5}


def test_scrapes_flushing_from_a_thread_while_the_loop_records_lose_nothing():
    request_metrics.flush()
    before = _ours()
    stop = threading.Event()

    def scrape():
        while not stop.is_set():
            request_metrics.flush()

    scraper = threading.Thread(target=scrape)
    scraper.start()

    async def serve():
        for _ in range(200):
            _record([("batch-race", "m", "ok", 0.001, None, False)] * 50)
            await asyncio.sleep(0)

    try:
        asyncio.run(serve())
    finally:
        stop.set()
        scraper.join()
    request_metrics.flush()
    written = _delta(before, _ours())
    key = (
        "haru_proxy_requests_total",
        (("fleet", "batch-race"), ("model", "m"), ("outcome", "ok")),
    )
    assert written[key] == 10_000
    assert written[("haru_proxy_overhead_seconds_count", ())] == 10_000
