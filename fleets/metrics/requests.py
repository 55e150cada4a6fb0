"""The proxy's Prometheus series (default registry, rendered by GET /metrics).

Labels are bounded: `fleet` is a fleet slug the store confirmed and `model` a bound model name,
else "" (client-chosen strings never become label values).

Written in batches. In multiprocess mode (fleets/metrics/registry.py) every increment is a
locked write into a shared file: five per request (a counter and two histograms, each a bucket
and a sum), about 7 us, the largest single cost of the proxy's own work on the healthy path. A
request only appends its figures to this process's queue; a flush sums the queue and writes the
sums, at most FLUSH_S later (a timer on the event loop), on every scrape this process serves, and at
exit. Summed in one pass, the label lookups and bucket searches cost less than spread over the
requests (summing per request was about 2% of the CPU per request). Another process's scrape
sees this one's requests up to FLUSH_S late; outside an event loop (a Celery task, a script)
each record is written at once.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import collections
import threading
from typing import Any

from prometheus_client import Counter, Histogram

from fleets.base.private_apis import counter_cell, histogram_cells
from fleets.metrics.registry import register_before_scrape

REQUESTS = Counter(
    "haru_proxy_requests",
    "Proxy requests by fleet, model and outcome (ok, upstream_4xx, upstream_5xx, "
    "client_disconnected, upstream_stream_error, or the error code answered).",
    ["fleet", "model", "outcome"],
)
TTFB = Histogram(
    "haru_proxy_ttfb_seconds",
    "From the request's arrival to the first response body byte sent to the client.",
    ["fleet"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
OVERHEAD = Histogram(
    "haru_proxy_overhead_seconds",
    "Time Haru adds to a request: from its arrival to the upstream call (auth, body, routing), "
    "plus from the upstream's headers to the client's.",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1),
)
STALE = Counter(
    "haru_proxy_stale_routing",
    "Requests served from cached routing because the state store was unreachable.",
    ["fleet"],
)


# Label children by their labels: `labels()` takes a lock and builds a key on every call, and
# this runs once per request. Bounded as the label values are (fleets x models x outcomes).
_requests: dict[tuple[str, str, str], Any] = {}
_ttfb: dict[str, Any] = {}
_stale: dict[str, Any] = {}

FLUSH_S = 0.5
# Requests recorded and not yet flushed, each (fleet, model, outcome, overhead, ttfb, stale).
# A deque: the loop appends and a scrape's thread pops, each atomic, without a lock. Past this
# many (a loop too busy to run its timer) a record flushes at once.
MAX_QUEUED = 50_000
_queue: collections.deque[tuple[str, str, str, float | None, float | None, bool]] = (
    collections.deque()
)
_lock = threading.Lock()  # one flush at a time
_timer: asyncio.TimerHandle | None = None
_timer_loop: asyncio.AbstractEventLoop | None = None


def record(
    *,
    fleet: str,
    model: str,
    outcome: str,
    overhead_s: float | None = None,
    ttfb_s: float | None = None,
    stale: bool = False,
) -> None:
    """Record one finished request (called after the response, off the streaming path)."""
    _queue.append((fleet, model, outcome, overhead_s, ttfb_s, stale))
    if len(_queue) >= MAX_QUEUED:
        flush()
        return
    _flush_soon()


def _flush_soon() -> None:
    global _timer, _timer_loop
    if _timer is not None and _timer_loop is not None and not _timer_loop.is_closed():
        return  # one timer per FLUSH_S at most (the loop is not looked up: a system call)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        flush()  # no loop to flush later on
        return
    # A timer left on a closed loop (tests run many) is replaced.
    _timer, _timer_loop = loop.call_later(FLUSH_S, _flush_due), loop


def _flush_due() -> None:
    # The timer's own callback, on its loop: only the loop's thread touches the timer (a
    # scrape's flush runs in a thread, and uvloop's timers must not be cancelled from one).
    global _timer, _timer_loop
    _timer = _timer_loop = None
    flush()


def flush() -> None:
    """Write what this process recorded since the last flush (any thread)."""
    with _lock:
        # prometheus_client's values (a counter's, a histogram bucket's or sum's), each with
        # what the queued requests add to it. The values are prometheus_client internals (there
        # is no public "observe many"; fleets/base/private_apis.py reaches them, and
        # tests/tools/test_private_apis.py checks them): test_proxy_metrics_batch.py proves a flush
        # writes what observing one by one would have.
        pending: dict[Any, float] = {}
        while _queue:
            fleet, model, outcome, overhead_s, ttfb_s, stale = _queue.popleft()
            key = (fleet, model, outcome)
            child = _requests.get(key)
            if child is None:
                child = _requests[key] = REQUESTS.labels(fleet, model, outcome)
            cell = counter_cell(child)
            pending[cell] = pending.get(cell, 0) + 1
            if overhead_s is not None:
                _observe(pending, OVERHEAD, overhead_s)
            if ttfb_s is not None:
                ttfb = _ttfb.get(fleet)
                if ttfb is None:
                    ttfb = _ttfb[fleet] = TTFB.labels(fleet)
                _observe(pending, ttfb, ttfb_s)
            if stale:
                counter = _stale.get(fleet)
                if counter is None:
                    counter = _stale[fleet] = STALE.labels(fleet)
                cell = counter_cell(counter)
                pending[cell] = pending.get(cell, 0) + 1
        for value, amount in pending.items():
            value.inc(amount)


def _observe(pending: dict[Any, float], histogram: Any, amount: float) -> None:
    # Histogram.observe's bucket: the first whose upper bound is at least `amount` (the last
    # bound is +Inf).
    bounds, buckets, total = histogram_cells(histogram)
    bucket = buckets[bisect.bisect_left(bounds, amount)]
    pending[bucket] = pending.get(bucket, 0) + 1
    pending[total] = pending.get(total, 0) + amount


atexit.register(flush)
register_before_scrape(flush)
