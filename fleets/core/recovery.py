"""Published recovery time: how long a failover takes, per fleet, from its drills and real ones.

A real failover (an automatic one, or an operator's promotion away from a failed active:
`fleets.core.outage.during_outage`) is one sample whose total is the failover figure
(fleets/core/outage.py): from the first moment a client could not be served to the routing
commit that served them again, the same figure as its `failoverMs` and
`haru_failover_duration_seconds`. Its parts are detection (`detection`: from the outage's start
to the failover's start) and the steps up to the switch. A drill measures the same steps on
the same standby (a check drill stops just before the switch, which is one compare-and-swap; a
round-trip drill measures its first switch too); it has no detection (0, labelled `none`):
nothing failed.

The outage's start is the operation's `detected_at`, recorded when the failover was requested
(an operator's promotion away from a failed active records it too, so the time the operator
took to notice and act counts); an operation requested before that was kept falls back to the
old active's last good heartbeat (`source_seen_at`). Only a failover with neither falls back to
the bound, the policy's `heartbeatStaleMs`, and says so (its total is then detection plus its
steps).

Pure: the caller reads the step events; `summarize` gives p50 and p95 over the last N.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from common.wire.codec import Wire, WireRecord, to_wire
from fleets.core.outage import outage_start
from fleets.core.states import FAILOVER_PATH, Step
from fleets.core.timestamps import utc_iso

# p50/p95 over this many most recent samples of each kind.
RECOVERY_WINDOW = 20


class RecoveryKind(StrEnum):
    DRILL = "drill"
    FAILOVER = "failover"


class Detection(StrEnum):
    """How a sample's detection time was obtained."""

    MEASURED = "measured"  # from the outage's start to the failover's start
    BOUND = "bound"  # not measurable (no timestamps): the policy's heartbeatStaleMs
    NONE = "none"  # a drill: nothing failed, nothing to detect


@dataclass(frozen=True)
class RecoverySample:
    kind: RecoveryKind
    finished_at: Annotated[datetime, Wire(encode=utc_iso)]
    detection_ms: int
    # Declared in its place on the wire (after detectionMs); passed by name.
    detection: Detection = field(default=Detection.MEASURED, kw_only=True)
    steps_ms: Mapping[str, int]
    # A real failover's figure (outage start to routing commit), when both are known: its total,
    # whatever its parts add up to (time the control plane was down between steps counts here,
    # as it did for every client, and not in any step). On the wire as totalMs only.
    failover_ms: Annotated[int | None, Wire(omit=True)] = field(default=None, kw_only=True)

    @property
    def total_ms(self) -> int:
        if self.failover_ms is not None:
            return self.failover_ms
        return self.detection_ms + sum(self.steps_ms.values())

    def to_json(self) -> dict[str, Any]:
        return {**to_wire(self), "totalMs": self.total_ms}


def detection_of(
    kind: RecoveryKind,
    *,
    started_at: datetime | None,
    detected_at: datetime | None,
    source_seen_at: datetime | None,
    bound_ms: int,
) -> tuple[int, Detection]:
    """Return a sample's detection time in ms and how it was obtained: see the module's
    docstring."""
    if kind == RecoveryKind.DRILL:
        return 0, Detection.NONE
    start = outage_start(detected_at=detected_at, source_seen_at=source_seen_at)
    if started_at is None or start is None:
        return max(0, bound_ms), Detection.BOUND
    return max(0, int((started_at - start).total_seconds() * 1000)), Detection.MEASURED


def sample(
    kind: RecoveryKind,
    finished_at: datetime,
    steps_ms: Mapping[str, int],
    detection_ms: int,
    detection: Detection = Detection.MEASURED,
    failover_ms: int | None = None,
) -> RecoverySample | None:
    """Build a sample from an operation's step durations; None unless every step of the
    failover path that this kind runs was recorded (a partial one would understate). A drill
    that moved routing (a round trip) counts its switch too. `failover_ms`: a real failover's
    figure (fleets.core.outage.failover_ms), its total."""
    wanted = (
        FAILOVER_PATH
        if kind == RecoveryKind.FAILOVER or Step.SWITCH_ROUTE in steps_ms
        else FAILOVER_PATH[:-1]
    )
    if any(step not in steps_ms for step in wanted):
        return None
    steps: dict[str, int] = {step: max(0, int(steps_ms[step])) for step in wanted}
    figure = failover_ms if kind == RecoveryKind.FAILOVER else None
    return RecoverySample(
        kind, finished_at, max(0, detection_ms), steps, detection=detection, failover_ms=figure
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class RecoverySummary(WireRecord):
    kind: RecoveryKind
    count: int
    p50_ms: float | None
    p95_ms: float | None
    last: RecoverySample | None


def summarize(
    kind: RecoveryKind, samples: Sequence[RecoverySample], window: int = RECOVERY_WINDOW
) -> RecoverySummary:
    """p50 and p95 of the newest `window` samples of `kind`."""
    mine = sorted((s for s in samples if s.kind == kind), key=lambda s: s.finished_at)[-window:]
    if not mine:
        return RecoverySummary(kind, 0, None, None, None)
    totals = [float(s.total_ms) for s in mine]
    return RecoverySummary(
        kind, len(mine), percentile(totals, 0.5), percentile(totals, 0.95), mine[-1]
    )


def over_objective(summary: RecoverySummary, rto_ms: int) -> bool:
    """Whether the published p95 drifted above the recovery time objective."""
    return summary.p95_ms is not None and summary.p95_ms > rto_ms
