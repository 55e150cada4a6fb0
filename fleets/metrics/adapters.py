"""Adapter freshness series, read from the database at scrape time (docs/rollouts.md,
"Adapter rollouts"): how old what users get is, and how long a trained checkpoint took to reach
its first user.

- `haru_adapter_served_age_seconds{fleet, adapter}`: now - completed_at of the version the
  adapter's route names (a candidate mid-rollout counts once it is the route's version); alert
  when a team that trains every day sees it pass a day or two;
- `haru_adapter_checkpoint_to_first_token_seconds{fleet, adapter}`: of the newest version a user
  got a token from, first_served_at - completed_at.

Labels are bounded: `fleet` a slug, `adapter` one of the fleet's routes (at most
MAX_ADAPTER_ROUTES). Two statements for every fleet together.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleets.base import clock
from fleets.metrics.scrape import read_store
from fleets.models import AdapterVersion, Fleet
from fleets.reads.adapters import MAX_VERSIONS, freshness, routes_of

# Fleets with adapter routes read in one scrape, at most (each adds up to 64 label sets).
MAX_FLEETS = 1000

_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "haru_adapter_served_age_seconds": (
        "Now minus the completion of the adapter version the route names: the age of what "
        "users are served.",
        ["fleet", "adapter"],
    ),
    "haru_adapter_checkpoint_to_first_token_seconds": (
        "Of the newest adapter version a user got a token from: its first token minus its "
        "completion.",
        ["fleet", "adapter"],
    ),
}


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        name: GaugeMetricFamily(name, doc, labels=labels)
        for name, (doc, labels) in _FAMILIES.items()
    }


class AdapterFreshnessCollector:
    def describe(self) -> list[Metric]:
        # Declared up front so registering never runs a query (import time has no database).
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        families = read_store("adapters", self._collect)
        yield from (families or {}).values()

    def _collect(self) -> dict[str, GaugeMetricFamily]:
        f = _families()
        fleets = [
            fleet
            for fleet in Fleet.objects.exclude(adapter_routes={})
            .only("id", "slug", "adapter_routes")
            .order_by("slug")[:MAX_FLEETS]
        ]
        routes = {fleet.id: routes_of(fleet) for fleet in fleets}
        names = {name for r in routes.values() for name in r}
        if not names:
            return f
        rows: dict[object, list] = {}
        for fleet_id, *row in (
            AdapterVersion.objects.filter(fleet_id__in=list(routes), name__in=names)
            .order_by("-version")
            .values_list("fleet_id", "name", "version", "completed_at", "first_served_at")[
                : MAX_FLEETS * MAX_VERSIONS
            ]
        ):
            rows.setdefault(fleet_id, []).append(tuple(row))
        now = clock.now()
        for fleet in fleets:
            for fresh in freshness(routes[fleet.id], rows.get(fleet.id, ()), now):
                labels = [fleet.slug, fresh.adapter]
                if fresh.served_age_s is not None:
                    f["haru_adapter_served_age_seconds"].add_metric(labels, fresh.served_age_s)
                if fresh.checkpoint_to_first_token_s is not None:
                    f["haru_adapter_checkpoint_to_first_token_seconds"].add_metric(
                        labels, fresh.checkpoint_to_first_token_s
                    )
        return f
