"""Step and failover durations, rebuilt from the database at scrape time.

Celery workers run the steps, often on other machines, so a histogram kept in the process that
ran a step is invisible to a scrape of the server. Every finished step is an Event row with its
duration (`operation.step.*`), every failed step leaves its start and end on the Operation, and
a real failover's figure is on its `switch_route` event (`failoverMs`: from the first moment a
client could not be served to the routing commit, fleets/core/outage.py; the same figure as its
recovery sample's total). Rebuilding the histograms from those rows makes one
`/metrics` of any replica tell the whole story. They count what the retention window keeps
(HARU_EVENT_RETENTION_DAYS): a prune lowers them, which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from fleets.core.states import OperationState, Step
from fleets.metrics.scrape import read_store
from fleets.models import Event, Operation

# Step durations span a no-op (milliseconds) to a large model's wake (minutes).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_STEP_EVENT_KINDS = (
    "operation.step.done",
    "operation.step.skipped",
    "operation.step.timeout_best_effort",
)


class _Histogram:
    """Bucket counts and a sum for one label set."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


def _outcome(event_kind: str) -> str:
    return event_kind.removeprefix("operation.step.")


def step_samples() -> Iterator[tuple[tuple[str, str, str], float]]:
    """Yield ((kind, step, outcome), seconds) for every recorded step."""
    rows = Event.objects.filter(
        kind__in=_STEP_EVENT_KINDS, duration_ms__isnull=False, operation__isnull=False
    ).values_list("operation__kind", "step", "kind", "duration_ms")
    for op_kind, step, kind, ms in rows.iterator(chunk_size=2000):
        if ms is not None:  # the filter says so; the type does not
            yield (op_kind, step, _outcome(kind)), max(0, ms) / 1000
    failed = Operation.objects.filter(
        state=OperationState.FAILED, step_started_at__isnull=False, finished_at__isnull=False
    ).values_list("kind", "error", "step_started_at", "finished_at")
    for op_kind, error, started, finished in failed.iterator(chunk_size=2000):
        at = error.get("step") if isinstance(error, dict) else None
        if isinstance(at, str) and at and started is not None and finished is not None:
            yield (op_kind, at, "failed"), max(0.0, (finished - started).total_seconds())


def failover_samples() -> Iterator[float]:
    """Yield the figure (outage start to routing commit) of every real failover on record."""
    rows = Event.objects.filter(
        kind="operation.step.done", step=Step.SWITCH_ROUTE, data__has_key="failoverMs"
    ).values_list("data", flat=True)
    for data in rows.iterator(chunk_size=2000):
        ms = data.get("failoverMs") if isinstance(data, dict) else None
        if isinstance(ms, int | float) and ms >= 0:
            yield ms / 1000


def _family(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _fill(
    family: HistogramMetricFamily, samples: Iterable[tuple[tuple[str, ...], float]]
) -> HistogramMetricFamily:
    by_labels: dict[tuple[str, ...], _Histogram] = defaultdict(_Histogram)
    for labels, seconds in samples:
        by_labels[labels].observe(seconds)
    for labels, hist in sorted(by_labels.items()):
        family.add_metric(list(labels), hist.buckets(), hist.total)
    return family


STEP_LABELS = ["kind", "step", "outcome"]
STEP_DOC = "Duration of each operation step, from its start to done, timeout or failure."
FAILOVER_DOC = (
    "Real failovers (automatic, or an operator's promotion away from a failed active): from the "
    "first moment a client could not be served to the routing pointer commit; the steps on the "
    "old active after the switch are not part of it."
)


class HistoryCollector(Collector):
    """Export step and failover duration histograms from Event and Operation rows."""

    def describe(self) -> list[HistogramMetricFamily]:
        # Declared up front so registering never runs a query (import time has no database).
        return [
            _family("haru_operation_step_duration_seconds", STEP_DOC, STEP_LABELS),
            _family("haru_failover_duration_seconds", FAILOVER_DOC, []),
        ]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        # haru_state_store_up says when the store could not be read (scrape.py).
        yield from read_store("step history", self._collect) or ()

    def _collect(self) -> list[HistogramMetricFamily]:
        steps = _fill(
            _family("haru_operation_step_duration_seconds", STEP_DOC, ["kind", "step", "outcome"]),
            step_samples(),
        )
        failovers = _fill(
            _family("haru_failover_duration_seconds", FAILOVER_DOC, []),
            (((), s) for s in failover_samples()),
        )
        return [steps, failovers]
