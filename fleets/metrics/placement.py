"""Prometheus metrics of GPU placement: planned and measured memory, sharing, refusals.

Planned memory comes from the slots' allocations and measured memory from each domain's last
supervisor report, both read from the database at scrape time (every replica agrees). Layout
refusals (`haru_placement_refusals_total`) are counted where the layout was planned, in
`fleets.layouts.planning` (process-local, like the step histograms).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from fleets.core.allocation import gpu_allocations
from fleets.core.report import read_report
from fleets.metrics.scrape import read_store
from fleets.models import Domain, ModelBinding, Slot


class GpuPlanCollector:
    """Export, per GPU of each planned domain, allocated and used memory and sharing count."""

    def describe(self):
        return list(self._families().values())

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        gpu = ["fleet", "domain", "gpu"]
        return {
            "allocated": GaugeMetricFamily(
                "haru_gpu_memory_allocated_mib",
                "Memory the plan grants a workload on a GPU: a server awake or asleep "
                "(its residue), a trainer (its budget).",
                labels=[*gpu, "workload", "posture"],
            ),
            "used": GaugeMetricFamily(
                "haru_gpu_memory_used_mib",
                "Memory the last supervisor report measured on a GPU, per workload.",
                labels=[*gpu, "workload"],
            ),
            "shared": GaugeMetricFamily(
                "haru_gpu_shared_count", "Workloads the plan places on a GPU.", labels=gpu
            ),
        }

    def collect(self):
        families = read_store("GPU plan", self._collect)  # None: the store is down (scrape.py)
        yield from (families or {}).values()

    def _collect(self) -> dict[str, GaugeMetricFamily]:
        families = self._families()
        # Only the columns the plan's bars need, as named tuples: the layout's other JSON
        # (specs, profiles, policies) decoded for every row was most of a scrape's time.
        planned = Domain.objects.exclude(gpu_layout={})
        domains: list[Any] = list(
            planned.order_by("fleet__slug", "priority", "slug").values_list(
                "id", "slug", "fleet__slug", "last_report", named=True
            )
        )
        slots_of: dict[object, list[Any]] = defaultdict(list)
        for s in (
            Slot.objects.filter(domain_id__in=planned.values("pk"))
            .order_by("gpu_index", "kind")
            .values_list(
                "id", "domain_id", "gpu_index", "gpu_indices", "kind", "allocation", named=True
            )
        ):
            slots_of[s.domain_id].append(s)
        bindings_of: dict[object, list[Any]] = defaultdict(list)
        for b in (
            ModelBinding.objects.filter(domain_id__in=planned.values("pk"))
            .order_by("name")
            .values_list("domain_id", "slot_id", "name", named=True)
        ):
            bindings_of[b.domain_id].append(b)
        for d in domains:
            slots, bindings = slots_of[d.id], bindings_of[d.id]
            for a in gpu_allocations(slots, bindings, read_report(d.last_report)):
                labels = [d.fleet__slug, d.slug, str(a.index)]
                families["shared"].add_metric(labels, a.sharing)
                for w in a.workloads:
                    if w.kind == "trainer":
                        families["allocated"].add_metric(
                            [*labels, w.name, "training"], w.planned_mib
                        )
                    else:
                        families["allocated"].add_metric([*labels, w.name, "awake"], w.planned_mib)
                        families["allocated"].add_metric([*labels, w.name, "asleep"], w.residue_mib)
                    if w.measured_mib is not None:
                        families["used"].add_metric([*labels, w.name], w.measured_mib)
        return families
