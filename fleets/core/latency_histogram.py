"""Small fixed latency histograms with log buckets: what a proxy keeps per arm and window.

Every proxy process counts its split requests' latencies into the same fixed buckets, so the
histograms of any number of processes and windows add up bucket by bucket, and percentiles
are read from the sum (fleets/reads/arm_stats.py). Bucket i holds latencies up to
`upper_ms(i)`: bounds grow by a factor of 2**(1/4) (about 19 %) from FIRST_MS, so a percentile
read from them is at most one bucket (19 %) above the exact one, enough to tell a candidate
twice as slow; the last bucket takes everything past LAST_MS.

Stored sparse, as [[bucket, count], ...] sorted by bucket: most requests of one arm in one
second fall in a handful of buckets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from typing import Any

from fleets.core.arm_stats import ArmWindow

FIRST_MS = 0.5
FACTOR = 2**0.25
# 0.5 ms .. about 131 s in 73 bounds, then one overflow bucket.
BOUNDS_MS: tuple[float, ...] = tuple(FIRST_MS * FACTOR**i for i in range(73))
BUCKETS = len(BOUNDS_MS) + 1
LAST_MS = BOUNDS_MS[-1]


def bucket_of(ms: float) -> int:
    """The bucket a latency of `ms` milliseconds falls in (negative and NaN: the first)."""
    if not ms > 0:  # noqa: SIM201 - also catches NaN
        return 0
    return bisect.bisect_left(BOUNDS_MS, ms)


def upper_ms(bucket: int) -> float:
    """The largest latency bucket `bucket` holds (the overflow bucket: LAST_MS)."""
    return BOUNDS_MS[min(bucket, len(BOUNDS_MS) - 1)]


def add(counts: dict[int, int], ms: float) -> None:
    bucket = bucket_of(ms)
    counts[bucket] = counts.get(bucket, 0) + 1


def sparse(counts: Mapping[int, int]) -> list[list[int]]:
    return [[b, n] for b, n in sorted(counts.items()) if n > 0]


def merge(into: dict[int, int], stored: Any) -> None:
    """Add a stored sparse histogram into `into`; skip entries that are not [bucket, count]."""
    if not isinstance(stored, list):
        return
    for entry in stored:
        if (
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
            and 0 <= entry[0] < BUCKETS
            and entry[1] > 0
        ):
            into[entry[0]] = into.get(entry[0], 0) + entry[1]


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The `q` quantile (0 < q <= 1) of a histogram as its bucket's upper bound; None if empty."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            return upper_ms(bucket)
    return upper_ms(max(counts))


def window(
    *, requests: int, errors: int, ttft: Mapping[int, int], itl: Mapping[int, int]
) -> ArmWindow:
    """One arm's ArmWindow from its summed counts and histograms."""
    return ArmWindow(
        requests=requests,
        errors=errors,
        ttft_samples=sum(ttft.values()),
        ttft_p50_ms=percentile(ttft, 0.50),
        ttft_p95_ms=percentile(ttft, 0.95),
        ttft_p99_ms=percentile(ttft, 0.99),
        itl_samples=sum(itl.values()),
        itl_p50_ms=percentile(itl, 0.50),
        itl_p95_ms=percentile(itl, 0.95),
        itl_p99_ms=percentile(itl, 0.99),
    )


def counts_of(values_ms: Iterable[float]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for ms in values_ms:
        add(counts, ms)
    return counts
