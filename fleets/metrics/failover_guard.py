"""What holds a failover back on purpose, read from the database at scrape time.

- `haru_fleet_failover_damped{fleet}`: 1 while the fleet's failovers are damped (it failed
  over `flapMaxFailovers` times within `flapWindowMs`, fleets.core.flapping), else 0; with
  `haru_fleet_failovers_in_flap_window{fleet}` (how many) and
  `haru_fleet_failover_damped_until_timestamp_seconds{fleet}` (when it ends, only while damped);
- `haru_fleet_active_held_by_data_path{fleet, domain}`: 1 while the active is degraded (its
  supervisor unreachable, slow, or unsure of a model) and not escalated because every model
  server still serves (fleets.core.failover.escalation_held), else 0.

Both drive alerts (deploy/prometheus/haru-alerts.yml): each is the reconciler choosing not to
move traffic, which the person on call must know about.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleets.base import clock
from fleets.core.failover import escalation_held
from fleets.core.flapping import flap_damping
from fleets.metrics.scrape import read_store, shared
from fleets.reads.fleet_list import FLEET_ROWS, every_fleet_rows, failover_commits_by_fleet

_FAMILIES: dict[str, tuple[str, list[str]]] = {
    "haru_fleet_failover_damped": (
        "1 while the fleet's automatic failovers are damped (flapMaxFailovers within "
        "flapWindowMs): a further one waits for the active to stay lost for flapHoldDownMs.",
        ["fleet"],
    ),
    "haru_fleet_failovers_in_flap_window": (
        "Automatic failovers whose routing committed within the fleet's flapWindowMs.",
        ["fleet"],
    ),
    "haru_fleet_failover_damped_until_timestamp_seconds": (
        "When the fleet's flap damping ends (Unix time); only while it is damped.",
        ["fleet"],
    ),
    "haru_fleet_active_held_by_data_path": (
        "1 while the active is degraded and not escalated because every model server still "
        "serves (supervisor unreachable, data path serving).",
        ["fleet", "domain"],
    ),
}


def _families() -> dict[str, GaugeMetricFamily]:
    return {
        name: GaugeMetricFamily(name, doc, labels=labels)
        for name, (doc, labels) in _FAMILIES.items()
    }


class FailoverGuardCollector:
    def describe(self) -> list[Metric]:
        # Declared up front so registering never runs a query (import time has no database).
        return list(_families().values())

    def collect(self) -> Iterator[Metric]:
        # None: the store is down, said once for the whole scrape (scrape.py).
        families = read_store("failover guards", self._collect)
        yield from (families or {}).values()

    def _collect(self) -> dict[str, GaugeMetricFamily]:
        f = _families()
        now = clock.now()
        # Every fleet read at once (fleets/reads/fleet_list.py), not four queries a fleet.
        rows = shared(FLEET_ROWS, every_fleet_rows)
        commits_of = failover_commits_by_fleet(rows, now)
        for fleet in rows.fleets:
            view = rows.view(fleet)
            commits = commits_of.get(fleet.pk, [])
            damping = flap_damping(commits, view.policy, now)
            f["haru_fleet_failover_damped"].add_metric([fleet.slug], 1 if damping else 0)
            f["haru_fleet_failovers_in_flap_window"].add_metric([fleet.slug], len(commits))
            if damping is not None:
                f["haru_fleet_failover_damped_until_timestamp_seconds"].add_metric(
                    [fleet.slug], damping.until.timestamp()
                )
            active = view.active
            if active is not None:
                f["haru_fleet_active_held_by_data_path"].add_metric(
                    [fleet.slug, active.slug], 1 if escalation_held(view, now) else 0
                )
        return f
