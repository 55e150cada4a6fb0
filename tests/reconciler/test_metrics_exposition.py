"""`/metrics`' own text writer: prometheus_client's bytes, and a bounded count per fleet."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from fleets.metrics.exposition import render
from fleets.metrics.registry import scrape_registry
from fleets.models import Domain
from fleets.services.operations import operation_request


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _awkward_families():
    gauge = GaugeMetricFamily("haru_x", "doc with \\ and\nnewline", labels=["fleet", "domain"])
    gauge.add_metric(["east-1", 'a"quote\\back\nline'], 1)
    gauge.add_metric(["ü-fleet", "west"], 0.000123)
    gauge.add_metric(["big", "west"], 12345678.5)
    gauge.add_metric(["inf", "west"], float("inf"))
    gauge.add_metric(["nan", "west"], float("nan"))
    gauge.add_metric(["neg", "west"], -3)
    counter = CounterMetricFamily("haru_ops", "ops", labels=["kind"])
    counter.add_metric(["promote"], 7)
    created = CounterMetricFamily("haru_made", "with created", labels=["a"], created=1.5)
    created.add_metric(["b"], 2, created=1.5)
    plain = GaugeMetricFamily("haru_up", "no labels", value=1)
    stamped = GaugeMetricFamily("haru_stamped", "a timestamp", labels=["a"])
    stamped.add_metric(["b"], 3, timestamp=12.5)
    hist = HistogramMetricFamily("haru_h", "hist", labels=["step"])
    hist.add_metric(["wake"], [("0.5", 1), ("+Inf", 3)], 4.5)
    dotted = GaugeMetricFamily("haru.dotted", "utf-8 name", labels=["le.x"])
    dotted.add_metric(["v"], 1)
    reserved = GaugeMetricFamily("haru_reserved", "a reserved label", labels=["__x"])
    reserved.add_metric(["v"], 1)
    return [gauge, counter, created, plain, stamped, hist, dotted, reserved]


def test_render_writes_the_bytes_prometheus_client_writes():
    families = _awkward_families()
    assert render(families) == generate_latest(_Families(families))


@pytest.mark.django_db
def test_a_scrape_renders_as_prometheus_client_would(fleet, tick, tmp_path):
    tick()
    registry = scrape_registry(tmp_path)
    families = list(registry.collect())  # one read; both writers get the same families
    ours = render(families)
    assert ours == generate_latest(_Families(families))
    assert b'haru_domain_state{domain="east",fleet="demo",state="ready"} 1.0' in ours


def _per_fleet_samples(text: str, slug: str) -> list[str]:
    return [line for line in text.splitlines() if f'fleet="{slug}"' in line]


@pytest.mark.django_db
def test_the_samples_of_a_fleet_stay_bounded_and_carry_information(fleet, tick, client):
    tick()
    west = Domain.objects.get(fleet=fleet, slug="west")
    for _ in range(3):  # more operations of one kind and outcome do not add series
        op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
        op.operation.__class__.objects.filter(pk=op.operation.pk).update(state="cancelled")
    text = client.get("/metrics").content.decode()
    samples = _per_fleet_samples(text, "demo")
    # Beside each planned GPU's bars (one per workload and posture: information, however
    # many): per domain its state, role and heartbeat age; per fleet its revision, readiness,
    # flap damping (three), objective, recovery samples (two kinds) and one (kind, outcome)
    # pair of operations. 43 for a two-domain fleet before the state sets' zeros were left out.
    # (A split model's per-arm request series, written by proxies this process ran in other
    # tests, are traffic, bounded by models and arms: not counted here.)
    fleet_and_domains = [
        line for line in samples if not line.startswith(("haru_gpu_", "haru_proxy_arm_"))
    ]
    assert len(fleet_and_domains) <= 2 * 3 + 9, "\n".join(fleet_and_domains)
    state_sets = ("haru_domain_state{", "haru_domain_role{", "haru_failover_readiness{")
    for line in samples:
        if line.startswith(state_sets):
            assert line.endswith(" 1.0"), line
    ops = [line for line in samples if line.startswith("haru_operations_total{")]
    assert ops == ['haru_operations_total{fleet="demo",kind="promote",outcome="cancelled"} 3.0']
    assert len(re.findall(r"^haru_domain_state\{", text, re.M)) == 2  # one per domain
