"""Failover drills end to end on real supervisors and simulated engines: scheduled, they prove
the standby wakes and answers its golden probe, and leave it as they found it."""

from __future__ import annotations

import pytest

from fleets.core.states import DRILL_STEPS
from fleets.models import Event, Fleet, GoldenBaseline, ModelBinding, Operation
from fleets.services.operations import operation_request
from tests.e2e.test_e2e_failover import (
    assert_nothing_in_flight,
    assert_routing_never_moved,
    finished,
    seen,
)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def scheduled_drill(fleet):
    def check():
        op = Operation.objects.filter(fleet=fleet, kind="drill").first()
        return op if op is not None and op.state not in ("pending", "running") else None

    return check


def test_a_scheduled_drill_runs_end_to_end_and_leaves_the_standby_in_posture(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    Fleet.objects.filter(pk=fleet.pk).update(drill_interval_minutes=1)

    op = drive(fleet, scheduled_drill(fleet), timeout=30)

    assert op.state == "succeeded", op.error
    assert op.reason == "scheduled_drill" and op.target_slug == "west"
    steps = {
        e.step: e.duration_ms
        for e in Event.objects.filter(operation=op, kind="operation.step.done")
    }
    assert set(steps) == set(DRILL_STEPS)
    assert all(isinstance(ms, int) and ms >= 0 for ms in steps.values())
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    assert set(west.asleep().values()) == {True}
    assert west.trainer()["state"] == "running"
    # The baselines came from what serves (the tick probed the active before the drill), and
    # the standby's first wake reproduced them instead of becoming them.
    recorded = Event.objects.filter(fleet=fleet, kind="golden.baseline.recorded")
    assert recorded.count() == 2
    assert {(e.operation_id, e.domain.slug, e.data["reason"]) for e in recorded} == {
        (None, "east", "active_serving")
    }
    probe = Event.objects.get(operation=op, kind="operation.step.done", step="probe")
    assert set(probe.data["golden"].values()) == {"match"}
    # Each supervisor's status reported its engines' version, kept per binding, and the
    # baselines are keyed by it.
    versions = set(
        ModelBinding.objects.filter(domain__fleet=fleet).values_list("engine_version", flat=True)
    )
    assert versions == {"sim-1"}
    baselines = GoldenBaseline.objects.filter(fleet=fleet)
    assert set(baselines.values_list("engine_version", flat=True)) == {"sim-1"}
    # Not due again within the interval: one drill, however many ticks.
    drive(fleet, lambda: True)
    assert Operation.objects.filter(fleet=fleet, kind="drill").count() == 1


def test_a_drill_that_finds_a_drifted_answer_fails_alerts_and_restores_posture(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    first = drive(fleet, finished(_drill(fleet)))
    assert first.state == "succeeded", first.error
    drive(fleet, lambda: west.trainer()["state"] == "running")
    west.fault("llama-small", answerDriftsAfterWake=True)

    op = drive(fleet, finished(_drill(fleet)))

    assert op.state == "failed" and op.error["code"] == "probe_mismatch"
    alert = Event.objects.get(operation=op, kind="drill.failed")
    assert alert.data["code"] == "probe_mismatch" and alert.data["domain"] == "west"
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    assert set(west.asleep().values()) == {True}
    assert west.trainer()["state"] == "running"


def _drill(fleet) -> Operation:
    result = operation_request(fleet=fleet, kind="drill", target_domain_id=None, actor="test")
    assert result.operation is not None
    return result.operation


def test_a_standby_broken_on_its_very_first_wake_is_caught_by_the_actives_baseline(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    # The tick baselines what the active serves before the standby ever wakes...
    drive(fleet, lambda: Event.objects.filter(kind="golden.baseline.recorded").count() == 2)
    # ...so a standby whose first wake already answers wrong is judged, not recorded.
    west.fault("llama-small", answerDriftsAfterWake=True)

    op = drive(fleet, finished(_drill(fleet)))

    assert op.state == "failed" and op.error["code"] == "probe_mismatch"
    assert "llama-small" in op.error["message"]
    assert not Event.objects.filter(operation=op, kind="golden.baseline.recorded").exists()
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
