"""The proxy's stream-continuation series (docs/proxy-hold.md, "Streams cut after their headers").

Labels are bounded: `fleet` is a fleet slug the store confirmed, `endpoint` chat or
completions, `reason` one of the fixed reasons in fleets/proxy/continuation.py. The dashboard's
failover view reads `haru_proxy_streams_continued_total`.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CONTINUED = Counter(
    "haru_proxy_streams_continued",
    "Streams cut after their headers (engine lost, sleep abort) and continued to their end on "
    "a domain routing committed to.",
    ["fleet", "endpoint"],
)
FAILURES = Counter(
    "haru_proxy_stream_continuation_failures",
    "Cut streams that were not continued (the client saw them cut), by reason.",
    ["fleet", "reason"],
)
SEAM_STALL = Histogram(
    "haru_proxy_stream_seam_stall_seconds",
    "Time a continued stream stood still at a cut: from the last chunk before it to the first "
    "after it.",
    ["fleet"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
)


def continued(fleet: str, endpoint: str) -> None:
    CONTINUED.labels(fleet, endpoint).inc()


def failed(fleet: str, reason: str) -> None:
    FAILURES.labels(fleet, reason).inc()


def stalled(fleet: str, seconds: float) -> None:
    SEAM_STALL.labels(fleet).observe(seconds)
