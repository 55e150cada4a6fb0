"""Published recovery time: how long a failover takes, per fleet, from its drills and real ones.

A sample is detection plus every step a failover runs before routing moves. A real failover
(an automatic one, or an operator's promotion away from a failed active: `during_outage`)
measures the steps from its start to the routing commit; a drill measures the same steps on the
same standby (a check drill stops just before the switch, which is one compare-and-swap; a
round-trip drill measures its first switch too).

Detection of a real failover is measured (`detection`): from the moment the outage began to
the moment the failover started. The outage began at the operation's `detected_at` or at the
old active's last good heartbeat (`source_seen_at`, kept when the failover was requested),
whichever is earlier: after its last good heartbeat the active was no longer known to serve,
so the figure is what a customer may have waited, never less. An operator's promotion has no
`detected_at`: its detection runs from that heartbeat to the moment the promotion started, the
time it took the operator to notice and act included. Only a failover with neither
timestamp falls back to the bound, the policy's `heartbeatStaleMs`, and says so. A drill has
no detection (0, labelled `none`): nothing failed.

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
from fleets.core.states import FAILOVER_PATH, DomainState, OperationKind, Step
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


def during_outage(*, kind: str, detected_at: datetime | None, source_state: str | None) -> bool:
    """Whether an operation runs while the fleet is down: a promotion away from a failed active.

    An automatic failover carries when its outage began (`detected_at`); an operator's promotion
    counts once the active it moves away from is failed. Whatever such a promotion waits for
    (a trainer's final save above all) is time every client waits too.
    """
    return kind == OperationKind.PROMOTE and (
        detected_at is not None or source_state == DomainState.FAILED
    )


@dataclass(frozen=True)
class RecoverySample:
    kind: RecoveryKind
    finished_at: Annotated[datetime, Wire(encode=utc_iso)]
    detection_ms: int
    # Declared in its place on the wire (after detectionMs); passed by name.
    detection: Detection = field(default=Detection.MEASURED, kw_only=True)
    steps_ms: Mapping[str, int]

    @property
    def total_ms(self) -> int:
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
    marks = [t for t in (detected_at, source_seen_at) if t is not None]
    if started_at is None or not marks:
        return max(0, bound_ms), Detection.BOUND
    outage_start = min(marks)
    return max(0, int((started_at - outage_start).total_seconds() * 1000)), Detection.MEASURED


def sample(
    kind: RecoveryKind,
    finished_at: datetime,
    steps_ms: Mapping[str, int],
    detection_ms: int,
    detection: Detection = Detection.MEASURED,
) -> RecoverySample | None:
    """Build a sample from an operation's step durations; None unless every step of the
    failover path that this kind runs was recorded (a partial one would understate). A drill
    that moved routing (a round trip) counts its switch too."""
    wanted = (
        FAILOVER_PATH
        if kind == RecoveryKind.FAILOVER or Step.SWITCH_ROUTE in steps_ms
        else FAILOVER_PATH[:-1]
    )
    if any(step not in steps_ms for step in wanted):
        return None
    steps: dict[str, int] = {step: max(0, int(steps_ms[step])) for step in wanted}
    return RecoverySample(kind, finished_at, max(0, detection_ms), steps, detection=detection)


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
