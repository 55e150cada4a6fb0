"""The /metrics series are hooked up from one place at start-up (`fleets.metrics.register`)."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from fleets import metrics
from fleets.metrics import registry
from fleets.metrics import requests as request_metrics


def test_start_up_registered_every_database_collector_and_the_flush_once():
    # FleetsConfig.ready() already called it; calling it again changes nothing.
    before = list(registry._database_collectors)
    metrics.register()
    assert (
        list(registry._database_collectors)
        == before
        == [
            "fleets.metrics.history.HistoryCollector",
            "fleets.metrics.readiness.ReadinessCollector",
            "fleets.metrics.failover_guard.FailoverGuardCollector",
            "fleets.metrics.reconcile.StateCollector",
            "fleets.metrics.placement.GpuPlanCollector",
            "fleets.metrics.rollouts.RolloutCollector",
            "fleets.metrics.adapters.AdapterFreshnessCollector",
        ]
    )
    assert len(registry.before_scrape.receivers) == 1


@pytest.mark.django_db
def test_a_scrape_writes_out_what_this_process_has_queued(client, monkeypatch):
    monkeypatch.setattr(request_metrics, "FLUSH_S", 600)  # only the scrape may flush it
    fleet = f"scrape-{uuid.uuid4().hex[:8]}"
    sample = f'haru_proxy_requests_total{{fleet="{fleet}",model="m",outcome="ok"}}'

    async def record_then_scrape() -> str:
        request_metrics.record(fleet=fleet, model="m", outcome="ok")  # queued, on a timer
        response = await asyncio.to_thread(client.get, "/metrics")
        return response.content.decode()

    text = asyncio.run(record_then_scrape())
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, flags=re.M)
    assert match is not None and float(match.group(1)) == 1
