"""The reconciler's Prometheus metrics, served by `GET /metrics` from the default registry.

Durable state (domain state and role, heartbeat age, route revision, operations by kind and
outcome) is read from the database at scrape time by `StateCollector`, and so are the step and
failover durations (`fleets.metrics.history`), so every server replica reports the
same numbers whichever process ran the tick. Tick counts and durations and supervisor call
errors are observed where the tick runs (the server's loop in the embedded default; a Celery
worker in production, whose host a server's /metrics or `manage.py metrics_host` sums).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleets.base import clock
from fleets.metrics.scrape import read_store
from fleets.models import Domain, Fleet, Operation
from fleets.reads.sightings import overlay, sightings_of

log = logging.getLogger(__name__)

# Step durations span a no-op (milliseconds) to a large model's wake (minutes).
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

SUPERVISOR_CALL_ERRORS = Counter(
    "haru_supervisor_call_errors_total",
    "Supervisor calls that produced no usable answer, by call and kind of error.",
    ["call", "kind"],
)
TICKS = Counter(
    "haru_reconcile_ticks_total",
    "Reconcile ticks by outcome (ok, skipped: another tick held the fleet's lease, taken_over: "
    "took an expired or dead holder's lease, lease_lost: stopped after another took it over, "
    "stopping: not run, or stopped, because this process is stopping, error).",
    ["outcome"],
)
TICK_DURATION = Histogram(
    "haru_reconcile_tick_duration_seconds",
    "Wall time of one reconcile tick of one fleet.",
    buckets=_STEP_BUCKETS,
)


class StateCollector:
    """Export the durable fleet state from the database at scrape time."""

    def describe(self) -> list[Metric]:
        # Declared up front so registering never runs a query (import time has no database).
        return [
            GaugeMetricFamily(
                "haru_domain_state",
                "1 for the state each domain is in.",
                labels=["fleet", "domain", "state"],
            ),
            GaugeMetricFamily(
                "haru_domain_role",
                "1 for the role each domain holds.",
                labels=["fleet", "domain", "role"],
            ),
            GaugeMetricFamily(
                "haru_domain_heartbeat_age_seconds",
                "Seconds since the last successful heartbeat.",
                labels=["fleet", "domain"],
            ),
            GaugeMetricFamily(
                "haru_fleet_route_revision", "The fleet's routing revision.", labels=["fleet"]
            ),
            CounterMetricFamily(
                "haru_operations",
                "Operations by kind and outcome (state).",
                labels=["fleet", "kind", "outcome"],
            ),
            GaugeMetricFamily(
                "haru_state_store_up", "1 when the metrics could read the state store."
            ),
        ]

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "haru_state_store_up", "1 when the metrics could read the state store."
        )
        families = read_store("state store", lambda: list(self._collect_state()))
        if families is None:  # down, or read by an earlier collector of this scrape as down
            up.add_metric([], 0)
            yield up
            return
        yield from families
        up.add_metric([], 1)
        yield up

    def _collect_state(self) -> list[Metric]:
        now = clock.now()
        state = GaugeMetricFamily(
            "haru_domain_state",
            "1 for the state each domain is in.",
            labels=["fleet", "domain", "state"],
        )
        role = GaugeMetricFamily(
            "haru_domain_role",
            "1 for the role each domain holds.",
            labels=["fleet", "domain", "role"],
        )
        age = GaugeMetricFamily(
            "haru_domain_heartbeat_age_seconds",
            "Seconds since the last successful heartbeat.",
            labels=["fleet", "domain"],
        )
        revision = GaugeMetricFamily(
            "haru_fleet_route_revision", "The fleet's routing revision.", labels=["fleet"]
        )
        ops = CounterMetricFamily(
            "haru_operations",
            "Operations by kind and outcome (state).",
            labels=["fleet", "kind", "outcome"],
        )

        fleets = {
            f.id: f for f in Fleet.objects.only("id", "slug", "active_domain_id", "route_revision")
        }
        for f in fleets.values():
            revision.add_metric([f.slug], f.route_revision)
        # A healthy host's last heartbeat may be kept on its fleet's tick lease (one query).
        for d in overlay(
            list(Domain.objects.only("id", "slug", "fleet_id", "state", "last_seen_at")),
            sightings_of(fleets),
        ):
            fleet = fleets.get(d.fleet_id)
            if fleet is None:
                continue
            # Only the member that holds: the zeros carried no information and were most of a
            # scrape at 1,000 fleets (rules and panels select `== 1`, `absent` or `unless`).
            state.add_metric([fleet.slug, d.slug, str(d.state)], 1)
            is_active = d.id == fleet.active_domain_id
            role.add_metric([fleet.slug, d.slug, "active" if is_active else "standby"], 1)
            if d.last_seen_at is not None:
                age.add_metric(
                    [fleet.slug, d.slug], max(0.0, (now - d.last_seen_at).total_seconds())
                )
        # Only the (kind, outcome) pairs a fleet has operations in: a pair without any is
        # absent, not 0 (fifteen zeros a fleet were a quarter of a scrape at 1,000 fleets).
        counts = (
            Operation.objects.values("fleet_id", "kind", "state")
            .annotate(n=Count("id"))
            .order_by("fleet_id", "kind", "state")
        )
        for row in counts:
            fleet = fleets.get(row["fleet_id"])
            if fleet is not None:
                ops.add_metric([fleet.slug, row["kind"], row["state"]], row["n"])
        return [state, role, age, revision, ops]
