"""Step and failover histograms come from the database, so any replica's /metrics has them.

The ticks here run in this process, but nothing of them is kept in memory: the numbers are
rebuilt from Event and Operation rows at scrape time, as they would be for work done by a
Celery worker on another machine.
"""

from __future__ import annotations

import re

import pytest

from fleets.metrics import history as history_metrics
from fleets.models import Event, Operation
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, flags=re.M)
    assert match, f"{sample} not in /metrics"
    return float(match.group(1))


def test_a_failover_shows_its_steps_and_its_duration_in_metrics(
    fleet, tick, hosts, client, fake_clock
):
    tick()
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)
    op = run_until_done(tick, clock=fake_clock, step_ms=5000)
    assert op.state == "succeeded"

    text = client.get("/metrics").content.decode()

    for step in ("stop_training", "verify_gpu", "wake", "probe", "switch_route"):
        labels = f'kind="promote",outcome="done",step="{step}"'
        assert _value(text, f"haru_operation_step_duration_seconds_count{{{labels}}}") == 1
    best_effort = 'kind="promote",outcome="timeout_best_effort",step="demote_old_sleep"'
    assert _value(text, f"haru_operation_step_duration_seconds_count{{{best_effort}}}") == 1
    assert _value(text, "haru_failover_duration_seconds_count") == 1
    assert _value(text, 'haru_failover_duration_seconds_bucket{le="+Inf"}') == 1
    switched = Event.objects.get(operation=op, step="switch_route", kind="operation.step.done")
    assert _value(text, "haru_failover_duration_seconds_sum") == pytest.approx(
        switched.data["failoverMs"] / 1000
    )


def test_a_failed_step_counts_with_its_time_from_the_operation_row(fleet, tick, hosts, domains):

    tick()
    hosts.hosts["west"].unauthorized = True
    operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    op = run_until_done(tick)
    assert op.state == "failed"

    samples = list(history_metrics.step_samples())

    failed = [(labels, s) for labels, s in samples if labels[2] == "failed"]
    assert failed == [(("promote", op.error["step"], "failed"), pytest.approx(0, abs=5))]


def test_histogram_buckets_are_cumulative():
    hist = history_metrics._Histogram()
    for seconds in (0.001, 0.3, 0.3, 1000):
        hist.observe(seconds)
    buckets = dict(hist.buckets())
    assert buckets["0.005"] == 1
    assert buckets["0.25"] == 1
    assert buckets["0.5"] == 3
    assert buckets["300"] == 3
    assert buckets["+Inf"] == 4
    assert hist.total == pytest.approx(1000.601)


def test_no_operation_no_samples(fleet):
    assert not Operation.objects.exists()
    assert list(history_metrics.step_samples()) == []
    assert list(history_metrics.failover_samples()) == []
