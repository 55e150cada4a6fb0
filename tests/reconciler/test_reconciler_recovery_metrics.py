"""Published recovery time and failover readiness in /metrics, rebuilt from the database."""

from __future__ import annotations

import re

import pytest

from fleets.models import Event, Operation
from fleets.reads.recovery import recovery_summaries
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db

PATH = ("stop_training", "verify_gpu", "wake", "probe", "switch_route")


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, flags=re.M)
    assert match, f"{sample} not in /metrics"
    return float(match.group(1))


def test_an_automatic_failover_is_published_as_a_recovery_sample(
    fleet, tick, hosts, client, fake_clock
):
    fleet.policy = {**fleet.policy, "rtoMs": 45_000}
    fleet.save(update_fields=["policy"])
    tick()
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)
    op = run_until_done(tick, clock=fake_clock, step_ms=5000)
    assert op.state == "succeeded"
    durations = {
        e.step: e.duration_ms
        for e in Event.objects.filter(operation=op, kind="operation.step.done", step__in=PATH)
    }
    # Measured, not the bound: from the outage's start (the earlier of the operation's
    # detected_at and the old active's last good heartbeat, kept on the operation when the
    # failover was requested) to the failover's start.
    east = fleet.domains.get(slug="east")
    assert east.last_seen_at is not None and op.detected_at is not None
    assert op.source_seen_at == east.last_seen_at
    assert op.started_at is not None
    outage_start = min(op.detected_at, op.source_seen_at)
    detection = int((op.started_at - outage_start).total_seconds() * 1000)
    expected_s = (detection + sum(durations.values())) / 1000

    summary = recovery_summaries(fleet)["failover"]
    assert summary.count == 1 and summary.last is not None
    assert summary.last.detection_ms == detection and summary.last.detection == "measured"
    assert dict(summary.last.steps_ms) == durations

    text = client.get("/metrics").content.decode()
    for q in ("0.5", "0.95"):
        sample = f'haru_recovery_seconds{{fleet="demo",kind="failover",quantile="{q}"}}'
        assert _value(text, sample) == pytest.approx(expected_s)
    assert _value(text, 'haru_recovery_samples{fleet="demo",kind="failover"}') == 1
    assert _value(text, 'haru_recovery_samples{fleet="demo",kind="drill"}') == 0
    assert _value(text, 'haru_recovery_objective_seconds{fleet="demo"}') == 45
    # The verdict the fleet is in reads 1; the other two are absent (not 0).
    verdicts = re.findall(
        r'^haru_failover_readiness\{fleet="demo",verdict="(\w+)"\} (\S+)$', text, re.M
    )
    assert len(verdicts) == 1 and verdicts[0][0] in ("ready", "at_risk", "not_ready")
    assert float(verdicts[0][1]) == 1
    assert "haru_drill_last_passed{" not in text  # no drill has finished yet

    report = client.get("/v1/fleets/demo/recovery").json()
    assert report["objectiveMs"] == 45_000 and report["window"] == 20
    assert report["overObjective"] is (expected_s * 1000 > 45_000)
    (only,) = report["samples"]
    assert only["kind"] == "failover" and only["detectionMs"] == detection
    assert only["detection"] == "measured"
    assert only["stepsMs"] == durations and only["totalMs"] == expected_s * 1000
    assert report["failover"]["p95Ms"] == expected_s * 1000
    assert report["drill"] == {
        "kind": "drill",
        "count": 0,
        "p50Ms": None,
        "p95Ms": None,
        "last": None,
    }


def _promote_by_hand(fleet, tick, fake_clock, target: str = "west"):
    result = operation_request(fleet=fleet, kind="promote", target_domain_id=target, actor="op")
    assert result.operation is not None
    op = run_until_done(tick, clock=fake_clock, step_ms=5000)
    assert op is not None and op.id == result.operation.id and op.state == "succeeded", op
    return op


def test_an_operators_promotion_away_from_a_failed_active_is_a_failover_sample(
    fleet, tick, hosts, fake_clock, domains
):
    fleet.policy = {**fleet.policy, "autoFailover": False}
    fleet.save(update_fields=["policy"])
    tick()
    hosts.hosts["east"].down = True
    tick()  # the heartbeat itself confirms the host is gone: failed, and nothing fails over
    assert domains()["east"].state == "failed" and not Operation.objects.exists()
    fake_clock.advance(ms=42_000)  # the operator takes a while to notice and act

    op = _promote_by_hand(fleet, tick, fake_clock)

    # The outage's start is recorded as for an automatic failover (the last moment east was
    # seen able to serve), not left out: this promotion answers an outage too.
    assert op.reason == "manual" and op.detected_at == domains()["east"].last_seen_at
    assert op.source_state == "failed"
    assert op.source_seen_at == domains()["east"].last_seen_at
    assert op.started_at is not None and op.served_at is not None
    # Measured as for an automatic failover: from the outage's start to the moment the
    # operator's promotion started; every client waited that long.
    detection = int((op.started_at - op.detected_at).total_seconds() * 1000)
    assert detection >= 42_000
    summary = recovery_summaries(fleet)["failover"]
    assert summary.count == 1 and summary.last is not None
    assert summary.last.detection == "measured" and summary.last.detection_ms == detection
    steps = {
        e.step: e.duration_ms
        for e in Event.objects.filter(operation=op, kind="operation.step.done", step__in=PATH)
    }
    assert dict(summary.last.steps_ms) == steps
    # One figure: outage start to the routing commit, as its switch_route event says too.
    figure = int((op.served_at - op.detected_at).total_seconds() * 1000)
    assert summary.p95_ms == figure == detection + sum(steps.values())
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] == figure


def test_a_planned_promotion_is_not_a_recovery_sample(fleet, tick, hosts, fake_clock):
    tick()
    op = _promote_by_hand(fleet, tick, fake_clock)
    assert op.source_state == "ready"
    assert recovery_summaries(fleet)["failover"].count == 0
