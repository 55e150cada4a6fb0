"""What the proxies saw of one arm of a split over a window: the gates' input.

The proxies record every request of a split model per arm ("stable", "candidate") across all
their processes; `fleets.reads.arm_stats.arm_windows` sums a window of those records into one
`ArmWindow` per arm. The rollout's gates (fleets/core/rollout.py) compare the candidate's
window with the stable arm's over the same window.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Arm(StrEnum):
    STABLE = "stable"
    CANDIDATE = "candidate"


@dataclass(frozen=True)
class ArmWindow:
    """One arm's requests over a window, summed over every proxy process.

    `errors`: requests that failed after the arm was chosen (an upstream error status, a cut,
    a refused connection that could not be retried on the other arm). Latencies are in
    milliseconds, None without a sample: time to first token (to the first content chunk of a
    stream, or the whole answer when not streamed) and inter-token latency (between content
    chunks of a stream).
    """

    requests: int = 0
    errors: int = 0
    ttft_samples: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_samples: int = 0
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None
