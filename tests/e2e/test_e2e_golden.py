"""Golden probes end to end: real supervisors and simulated engines that answer differently
after a wake (a drifted model, or a LoRA adapter that silently stopped applying)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleets.base.errors import InvalidTarget
from fleets.core.policy import Policy
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, GoldenBaseline
from fleets.reconciler.golden import record_baselines
from fleets.reconciler.supervisor.client import client_for
from fleets.services.layouts import layout_apply
from tests.e2e.harness import fleet_layout
from tests.e2e.test_e2e_failover import (
    assert_nothing_in_flight,
    assert_routing_never_moved,
    finished,
    promote,
    seen,
)

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ADAPTERS = {"qwen-small": ["qwen-sql"]}


def record_from_active(fleet: Fleet):
    fleet.refresh_from_db()
    return record_baselines(
        domain=Domain.objects.get(pk=fleet.active_domain_id),
        policy=Policy.resolve(fleet.policy),
        actor="api:operator",
        client_for=client_for,
    )


@pytest.fixture
def golden_hosts(make_hosts):
    def make():
        return make_hosts(east={"adapters": ADAPTERS}, west={"adapters": ADAPTERS})

    return make


@pytest.mark.parametrize(
    ("fault", "named", "expected", "got"),
    [
        # vLLM issue 53888: after a wake the adapter no longer applies, with no error.
        (
            "adaptersLostAfterWake",
            "qwen-small (adapter qwen-sql)",
            "Adapter qwen-sql applied.",
            "a simulated model server.",
        ),
        ("answerDriftsAfterWake", "qwen-small", "Hello from", "Drifted after wake"),
    ],
)
def test_an_answer_that_changed_over_the_wake_fails_the_promotion_with_probe_mismatch(
    golden_hosts, make_fleet, drive, fault, named, expected, got
):
    east, west = golden_hosts()
    fleet = make_fleet(east, west, {"probe": {"prompt": "ping", "maxTokens": 16}})
    drive(fleet, seen(fleet))
    recording = record_from_active(fleet)
    # The tick's baseline pass may have recorded the same answers first: unchanged, then.
    assert sorted(recording.recorded + recording.unchanged) == [
        "llama-small",
        "qwen-small",
        "qwen-small (adapter qwen-sql)",
    ]
    west.fault("qwen-small", **{fault: True})

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "failed"
    assert op.error["step"] == "probe" and op.error["code"] == "probe_mismatch"
    message = op.error["message"]
    assert f"{named}: expected" in message
    assert expected in message.split(", got ")[0] and got in message.split(", got ")[1]
    assert "llama-small" not in message
    assert_routing_never_moved(fleet)
    assert_nothing_in_flight(fleet)
    # Back in standby posture: asleep again, trainer running.
    assert set(west.asleep().values()) == {True}
    assert west.trainer()["state"] == "running"
    # The mismatch never overwrote the known-good baseline.
    assert not GoldenBaseline.objects.filter(fleet=fleet, reason="first_serving").exists()


def test_the_serving_active_records_the_baseline_and_every_later_wake_must_reproduce_it(
    golden_hosts, make_fleet, drive
):
    east, west = golden_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))
    recorded = Event.objects.filter(fleet=fleet, kind="golden.baseline.recorded")
    drive(fleet, lambda: recorded.count() == 3)
    # From what serves, before any standby woke: the tick's baseline pass on the active.
    assert {
        (e.data["model"], e.data["adapter"], e.data["reason"], e.domain.slug) for e in recorded
    } == {
        ("llama-small", None, "active_serving", "east"),
        ("qwen-small", None, "active_serving", "east"),
        ("qwen-small", "qwen-sql", "active_serving", "east"),
    }
    assert {e.data["engineVersion"] for e in recorded} == {"sim-1"}

    first = drive(fleet, finished(promote(fleet, "west")))
    assert first.state == "succeeded", first.error
    probe = Event.objects.get(operation=first, kind="operation.step.done", step="probe")
    assert set(probe.data["golden"].values()) == {"match"}
    assert recorded.count() == 3  # west's wake was judged, not recorded
    # East was demoted by the promotion; its wake back must answer what it answered before.
    drive(fleet, lambda: set(east.asleep().values()) == {True})
    east.fault("llama-small", answerDriftsAfterWake=True)

    back = drive(fleet, finished(promote(fleet, "east")))

    assert back.state == "failed" and back.error["code"] == "probe_mismatch"
    assert "llama-small: expected" in back.error["message"]
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "west"


def test_a_model_the_layout_marks_non_deterministic_only_has_to_answer(
    golden_hosts, make_fleet, drive
):
    east, west = golden_hosts()
    data = fleet_layout(east, west)
    for domain in data["domains"]:
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                if model["name"] == "qwen-small":
                    model["deterministic"] = False
    layout_apply(layout=parse_layout(data))
    fleet = Fleet.objects.get(slug=data["slug"])
    drive(fleet, seen(fleet))
    recording = record_from_active(fleet)
    assert recording.recorded + recording.unchanged == ["llama-small"]
    assert sorted(recording.skipped) == ["qwen-small", "qwen-small (adapter qwen-sql)"]
    west.fault("qwen-small", answerDriftsAfterWake=True, adaptersLostAfterWake=True)

    op = drive(fleet, finished(promote(fleet)))

    assert op.state == "succeeded", op.error
    done = Event.objects.get(operation=op, kind="operation.step.done", step="probe")
    assert done.data["golden"] == {
        "llama-small": "match",
        "qwen-small": "answered",
        "qwen-small:qwen-sql": "answered",
    }


def test_recording_a_baseline_is_refused_on_a_sleeping_standby_with_nothing_recorded(
    golden_hosts, make_fleet, drive
):
    east, west = golden_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, seen(fleet))

    with pytest.raises(InvalidTarget, match="west is not serving"):
        record_baselines(
            domain=Domain.objects.get(fleet=fleet, slug="west"),
            policy=Policy.resolve(fleet.policy),
            actor="api:operator",
            client_for=client_for,
        )
    # Nothing from the standby (the tick's pass records only what the active serves).
    west_id = Domain.objects.get(fleet=fleet, slug="west").id
    assert not GoldenBaseline.objects.filter(fleet=fleet, domain_id=west_id).exists()
    assert not Event.objects.filter(
        fleet=fleet, kind="golden.baseline.recorded", domain_id=west_id
    ).exists()


def test_a_key_the_active_never_recorded_is_recorded_by_the_first_serving_as_before(
    golden_hosts, make_fleet, drive
):
    east, west = golden_hosts()
    fleet = make_fleet(east, west)
    # The active is not probed (its fleet's turn is taken for a day), as when it cannot be.
    Fleet.objects.filter(pk=fleet.pk).update(baseline_probe_at=timezone.now() + timedelta(days=1))
    drive(fleet, seen(fleet))

    first = drive(fleet, finished(promote(fleet, "west")))

    assert first.state == "succeeded", first.error
    recorded = Event.objects.filter(fleet=fleet, kind="golden.baseline.recorded")
    assert {(e.data["model"], e.data["reason"], e.operation_id) for e in recorded} == {
        ("llama-small", "first_serving", first.id),
        ("qwen-small", "first_serving", first.id),
    }
