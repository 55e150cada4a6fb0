"""Our control plane driving supervisors that behave like the original's: a whole promotion,
then a demotion of the old standby, with no supervisor call counted as an error."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from fleets.models import Fleet
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


def call_errors() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "haru_supervisor_call_errors":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


@pytest.fixture
def originals(hosts):
    for host in hosts.hosts.values():
        host.original = True
        host.features = ()
    return hosts


def test_a_promotion_and_a_demotion_against_original_supervisors(
    fleet, tick, originals, domains, fake_clock
):
    before = call_errors()
    tick()  # heartbeats: nothing learned beyond the original contract
    west = domains()["west"]
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op.state == "succeeded", op.error
    assert Fleet.objects.get(pk=fleet.pk).active_domain_id == west.id
    east = domains()["east"]
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=east.id).operation
    op = run_until_done(tick)
    assert op.state == "succeeded", op.error
    assert call_errors() == before
    for host in originals.hosts.values():
        for _, url, body in host.requests:
            assert "models" not in body  # never a field the original refuses
            assert "waitMs" not in url and "budgetMs" not in url  # nor our sleep's bounds
            assert "drainMs" not in url
    probes = [url for _, url, _ in originals.hosts["west"].requests if "/v1/probe" in url]
    assert probes and all("model=" in url for url in probes)  # the original's selector
