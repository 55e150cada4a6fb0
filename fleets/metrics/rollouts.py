"""Rollout series, read from the database at scrape time (docs/rollouts.md, "Metrics").

One scrape sees them whatever process ran the tick that moved the rollout. Per fleet, its newest
rollout (in flight, or the last one that ended), so a fleet has at most one of each:

- `haru_rollout_state{fleet, model, state}`: 1 for the state the newest rollout is in (alert on
  `state="rolled_back"` or `state="failed"`; `paused` waits for an operator);
- `haru_rollout_weight_permille{fleet, model}`: the candidate's share of the model's traffic;
- `haru_rollout_step{fleet, model}`: the step it is on, from 1 (0 before its first weight);
- `haru_rollout_breach_to_weight_change_seconds{fleet, model}`: the newest rollout that rolled
  back on a breach (a gate or an answer check): from the breach to the candidate's weight at 0.

Labels are bounded: `fleet` a slug, `model` one served name per fleet, `state` one of the
rollout's states. Two statements for every fleet together.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import OuterRef, Subquery
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleets.metrics.scrape import read_store
from fleets.models import Fleet, Rollout

BREACH_KEY = "breachToWeightChangeMs"

_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "haru_rollout_state": (
        "1 for the state of the fleet's newest rollout (in flight, or the last one that ended).",
        ["fleet", "model", "state"],
    ),
    "haru_rollout_weight_permille": (
        "The rollout candidate's share of the model's traffic, per mille.",
        ["fleet", "model"],
    ),
    "haru_rollout_step": (
        "The step the fleet's newest rollout is on, from 1 (0 before its first weight).",
        ["fleet", "model"],
    ),
    "haru_rollout_breach_to_weight_change_seconds": (
        "Of the fleet's newest rollout rolled back on a breach (a gate or an answer check): "
        "from the breach to the candidate's weight at 0.",
        ["fleet", "model"],
    ),
}


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        name: GaugeMetricFamily(name, doc, labels=labels)
        for name, (doc, labels) in _FAMILIES.items()
    }


class RolloutCollector:
    def describe(self) -> list[Metric]:
        # Declared up front so registering never runs a query (import time has no database).
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        families = read_store("rollouts", self._collect)
        yield from (families or {}).values()

    def _collect(self) -> dict[str, GaugeMetricFamily]:
        f = _families()
        newest = Rollout.objects.filter(fleet=OuterRef("pk")).order_by("-created_at")
        breached = newest.filter(progress__has_key=BREACH_KEY)
        rows = list(
            Fleet.objects.annotate(
                newest_id=Subquery(newest.values("pk")[:1]),
                breached_id=Subquery(breached.values("pk")[:1]),
            )
            .filter(newest_id__isnull=False)
            .values_list("slug", "newest_id", "breached_id")
            .order_by("slug")
        )
        ids = {pk for _, a, b in rows for pk in (a, b) if pk is not None}
        rollouts = {
            r.pk: r
            for r in Rollout.objects.filter(pk__in=ids).only(
                "pk", "model", "state", "weight_permille", "step_index", "progress"
            )
        }
        for slug, newest_id, breached_id in rows:
            rollout = rollouts.get(newest_id)
            if rollout is not None:
                labels = [slug, rollout.model]
                f["haru_rollout_state"].add_metric([*labels, rollout.state], 1)
                f["haru_rollout_weight_permille"].add_metric(labels, rollout.weight_permille)
                f["haru_rollout_step"].add_metric(labels, max(0, rollout.step_index + 1))
            breach = rollouts.get(breached_id)
            if breach is None:
                continue
            ms = (breach.progress or {}).get(BREACH_KEY)
            if isinstance(ms, int | float) and not isinstance(ms, bool):
                f["haru_rollout_breach_to_weight_change_seconds"].add_metric(
                    [slug, breach.model], ms / 1000
                )
        return f
