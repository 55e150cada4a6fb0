"""The proxy's Prometheus series per arm of a weighted split (fleets/proxy/arm_stats.py).

Labels are bounded: `fleet` is a slug the store confirmed, `model` a split model's bound name
(a fleet holds at most route_split.MAX_SPLITS splits), `arm` stable or candidate. Written once
a second from the per-arm recorder's flush (its own thread), from the histograms it already
summed, never per request: a split request costs the data path no metrics write.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Histogram

from fleets.base.private_apis import counter_cell, histogram_cells
from fleets.core.latency_histogram import upper_ms

_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

ARM_REQUESTS = Counter(
    "haru_proxy_arm_requests",
    "Requests of a split model by the arm (stable, candidate) that served them; a candidate "
    "attempt retried on the stable arm counts on both.",
    ["fleet", "model", "arm"],
)
ARM_ERRORS = Counter(
    "haru_proxy_arm_errors",
    "Requests of a split model that failed on that arm (an upstream 5xx, a refused or lost "
    "connection, a broken stream, a proxy error after the arm was chosen).",
    ["fleet", "model", "arm"],
)
ARM_TTFT = Histogram(
    "haru_proxy_arm_ttft_seconds",
    "Time to first token per arm: from the request's arrival to the first content sent to the "
    "client (the whole answer when not streamed). Summed from log buckets: each observation "
    "counts at its log bucket's upper bound.",
    ["fleet", "model", "arm"],
    buckets=_BUCKETS_S,
)
ARM_ITL = Histogram(
    "haru_proxy_arm_itl_seconds",
    "Inter-token latency per arm: between content chunks of a stream.",
    ["fleet", "model", "arm"],
    buckets=_ITL_BUCKETS_S,
)
SAMPLES_DROPPED = Counter(
    "haru_proxy_arm_samples_dropped",
    "Per-arm request samples this process dropped instead of storing: reason store (the "
    "state store refused or failed the write; traffic untouched) or full (more windows "
    "pending than the recorder keeps).",
    ["reason"],
)

_children: dict[tuple[Any, tuple[str, str, str]], Any] = {}


def _child(metric: Any, labels: tuple[str, str, str]) -> Any:
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def observe(
    arms: Iterable[tuple[tuple[str, str, str], int, int, Mapping[int, int], Mapping[int, int]]],
) -> None:
    """Write summed figures: ((fleet, model, arm), requests, errors, ttft, itl) each, the
    histograms as log-bucket counts (fleets/core/latency_histogram.py)."""
    for labels, requests, errors, ttft, itl in arms:
        if requests:
            counter_cell(_child(ARM_REQUESTS, labels)).inc(requests)
        if errors:
            counter_cell(_child(ARM_ERRORS, labels)).inc(errors)
        _add(_child(ARM_TTFT, labels), ttft)
        _add(_child(ARM_ITL, labels), itl)


def _add(histogram: Any, counts: Mapping[int, int]) -> None:
    if not counts:
        return
    bounds, buckets, total = histogram_cells(histogram)
    added = 0.0
    for bucket, n in counts.items():
        seconds = upper_ms(bucket) / 1000
        buckets[bisect.bisect_left(bounds, seconds)].inc(n)
        added += n * seconds
    total.inc(added)


def dropped(reason: str, n: int) -> None:
    if n > 0:
        SAMPLES_DROPPED.labels(reason).inc(n)
