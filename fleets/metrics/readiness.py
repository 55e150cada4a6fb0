"""Readiness, drill and recovery-time series, read from the database at scrape time.

- `haru_failover_readiness{fleet, verdict}`: 1 for the verdict the fleet is in (alert on
  `verdict="not_ready"`);
- `haru_drill_last_passed{fleet}` and `haru_drill_last_finished_timestamp_seconds{fleet}`: the
  last finished drill (absent before the first; a 0 is a failed drill, the alert);
- `haru_recovery_seconds{fleet, kind, quantile}` over the last N drills and real failovers
  (automatic ones, and an operator's promotion away from a failed active; kind drill or
  failover; quantile 0.5 and 0.95), `haru_recovery_samples{fleet, kind}`, and
  `haru_recovery_objective_seconds{fleet}` (policy rtoMs): deploy/prometheus alerts when the
  p95 drifts above the objective.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleets.base import clock
from fleets.core.readiness import ReadinessVerdict
from fleets.metrics.scrape import read_store, shared
from fleets.reads.fleet_list import FLEET_ROWS, every_fleet_rows, last_drills, readinesses
from fleets.reads.readiness import drill_facts
from fleets.reads.recovery import recovery_samples_of, summaries

_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "haru_failover_readiness": (
        "1 for the failover readiness verdict of each fleet.",
        ["fleet", "verdict"],
    ),
    "haru_drill_last_passed": (
        "1 when the fleet's last finished drill passed, 0 when it failed.",
        ["fleet"],
    ),
    "haru_drill_last_finished_timestamp_seconds": (
        "When the fleet's last drill finished (Unix time).",
        ["fleet"],
    ),
    "haru_recovery_seconds": (
        "Recovery time over the last N drills or real failovers: a failover's figure, from the "
        "first moment a client could not be served to the routing commit (the same figure as "
        "haru_failover_duration_seconds); a drill's steps up to the switch.",
        ["fleet", "kind", "quantile"],
    ),
    "haru_recovery_samples": (
        "How many drills or real failovers the recovery quantiles cover.",
        ["fleet", "kind"],
    ),
    "haru_recovery_objective_seconds": (
        "The fleet's recovery time objective (policy rtoMs).",
        ["fleet"],
    ),
}


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        name: GaugeMetricFamily(name, doc, labels=labels)
        for name, (doc, labels) in _FAMILIES.items()
    }


class ReadinessCollector:
    def describe(self) -> list[Metric]:
        # Declared up front so registering never runs a query (import time has no database).
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        # haru_state_store_up says when the store could not be read (scrape.py).
        families = read_store("readiness", self._collect)
        yield from (families or {}).values()

    def _collect(self) -> dict[str, GaugeMetricFamily]:
        # Every fleet's verdict, drill and recovery read with a few queries for all of them
        # (fleets/reads/fleet_list.py): one set per fleet made a scrape of 1,000 take seconds.
        f = _families()
        now = clock.now()
        rows = shared(FLEET_ROWS, every_fleet_rows)
        fleets = rows.fleets
        verdicts = readinesses(rows, now)
        drills = last_drills([fleet.pk for fleet in fleets])
        samples = recovery_samples_of(
            fleets, policies={fleet.pk: rows.view(fleet).policy for fleet in fleets}
        )
        for fleet in fleets:
            # The verdict the fleet is in, 1; the others are absent rather than 0 (alerts and
            # panels select `== 1`): two zeros a fleet cost a scrape of 1,000 fleets 2,000 lines.
            verdict = ReadinessVerdict(verdicts[fleet.pk].verdict)
            f["haru_failover_readiness"].add_metric([fleet.slug, verdict.value], 1)
            drill = drill_facts(drills.get(fleet.pk))
            if drill is not None:
                f["haru_drill_last_passed"].add_metric([fleet.slug], 1 if drill.passed else 0)
                f["haru_drill_last_finished_timestamp_seconds"].add_metric(
                    [fleet.slug], drill.finished_at.timestamp()
                )
            for kind, summary in summaries(samples[fleet.pk]).items():
                f["haru_recovery_samples"].add_metric([fleet.slug, kind], summary.count)
                for q, ms in (("0.5", summary.p50_ms), ("0.95", summary.p95_ms)):
                    if ms is not None:
                        f["haru_recovery_seconds"].add_metric([fleet.slug, kind, q], ms / 1000)
            rto = rows.view(fleet).policy.rto_ms
            f["haru_recovery_objective_seconds"].add_metric([fleet.slug], rto / 1000)
        return f
