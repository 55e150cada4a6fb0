"""The proxy's Prometheus series (default registry, rendered by GET /metrics).

Labels are bounded: `fleet` is a fleet slug the store confirmed and `model` a bound model name,
else "" (client-chosen strings never become label values). Each worker process has its own
registry: with several uvicorn workers a scrape sees one of them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

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
    key = (fleet, model, outcome)
    child = _requests.get(key)
    if child is None:
        child = _requests[key] = REQUESTS.labels(fleet, model, outcome)
    child.inc()
    if overhead_s is not None:
        OVERHEAD.observe(overhead_s)
    if ttfb_s is not None:
        ttfb = _ttfb.get(fleet)
        if ttfb is None:
            ttfb = _ttfb[fleet] = TTFB.labels(fleet)
        ttfb.observe(ttfb_s)
    if stale:
        STALE.labels(fleet).inc()
