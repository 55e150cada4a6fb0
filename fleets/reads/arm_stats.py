"""What the proxies saw of each arm of a rollout's split over a window: the gates' input.

Sums the per-second rows every proxy process stored (fleets/proxy/arm_stats.py) over
[since, until) and reads the percentiles from the summed log-bucket histograms
(fleets/core/latency_histogram.py: each percentile is its bucket's upper bound, at most 19 %
above the exact value). One indexed range read; bounded by the rows the retention keeps.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from fleets.core import latency_histogram as hist
from fleets.core.arm_stats import Arm, ArmWindow
from fleets.models import ArmSample

# A window's rows: (processes x seconds) per arm. Past this many the read stops, the oldest
# left out (a gate window is minutes; the retention is hours).
MAX_ROWS = 200_000


def arm_windows(
    *, rollout_id: str, model: str, since: datetime, until: datetime | None = None
) -> dict[Arm, ArmWindow]:
    """Both arms' windows of `model` in rollout `rollout_id` over [since, until) (until: now);
    an arm with no sample reads as an empty `ArmWindow()`. A `rollout_id` that is not a UUID
    raises ValueError."""
    rows = ArmSample.objects.filter(
        rollout_id=uuid.UUID(str(rollout_id)), model=model, window_start__gte=since
    )
    if until is not None:
        rows = rows.filter(window_start__lt=until)
    sums: dict[Arm, tuple[list[int], dict[int, int], dict[int, int]]] = {
        arm: ([0, 0], {}, {}) for arm in Arm
    }
    for arm, requests, errors, ttft, itl in rows.order_by("-window_start").values_list(
        "arm", "requests", "errors", "ttft", "itl"
    )[:MAX_ROWS]:
        if arm not in sums:
            continue
        counts, ttft_sum, itl_sum = sums[Arm(arm)]
        counts[0] += requests
        counts[1] += errors
        hist.merge(ttft_sum, ttft)
        hist.merge(itl_sum, itl)
    return {
        arm: (
            hist.window(requests=counts[0], errors=counts[1], ttft=ttft_sum, itl=itl_sum)
            if counts[0] or ttft_sum or itl_sum
            else ArmWindow()
        )
        for arm, (counts, ttft_sum, itl_sum) in sums.items()
    }
