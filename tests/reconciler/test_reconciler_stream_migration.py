"""A planned promotion gives the old active's sleep a drain bound (`?drainMs=`) when, and only
when, its long streams can move: routing already on the probed new active, every model on both
sides an engine that can continue a stream, and the old supervisor listing drain-bound."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from fleets.models import Event, Fleet, ModelBinding
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


def sleep_queries(host) -> list[dict[str, list[str]]]:
    return [
        parse_qs(urlsplit(url).query)
        for method, url, _ in host.requests
        if method == "POST" and urlsplit(url).path == "/v1/vllm/sleep"
    ]


def promote_west(fleet, tick, domains, fake_clock):
    tick()  # heartbeats: each supervisor's features are learned
    west = domains()["west"]
    operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op is not None and op.state == "succeeded", op.error
    return op


def sleep_step(op) -> dict:
    event = Event.objects.get(operation=op, kind="operation.step.done", step="demote_old_sleep")
    return event.data


def set_policy(fleet, **keys) -> None:
    Fleet.objects.filter(pk=fleet.pk).update(policy={**fleet.policy, **keys})


def test_a_planned_promotion_bounds_the_old_actives_drain_by_the_policy(
    fleet, tick, hosts, domains, fake_clock
):
    set_policy(fleet, streamMigrationAfterMs=2500)
    op = promote_west(fleet, tick, domains, fake_clock)
    sleeps = sleep_queries(hosts.hosts["east"])
    assert sleeps and all(q["drainMs"] == ["2500"] for q in sleeps)
    # The bound went with the sleep that came after the switch, never before it.
    switched = Event.objects.get(operation=op, kind="fleet.route.switched").created_at
    step = Event.objects.get(operation=op, kind="operation.step.done", step="demote_old_sleep")
    assert step.created_at >= switched
    assert sleep_step(op)["drainBoundMs"] == 2500
    assert sleep_queries(hosts.hosts["west"]) == []  # the new active is never slept


def test_the_default_policy_migrates_at_the_switch(fleet, tick, hosts, domains, fake_clock):
    op = promote_west(fleet, tick, domains, fake_clock)
    assert {q["drainMs"][0] for q in sleep_queries(hosts.hosts["east"])} == {"0"}
    assert sleep_step(op)["drainBoundMs"] == 0


def test_migration_switched_off_keeps_the_full_drain(fleet, tick, hosts, domains, fake_clock):
    set_policy(fleet, streamMigrationAfterMs=None)
    op = promote_west(fleet, tick, domains, fake_clock)
    sleeps = sleep_queries(hosts.hosts["east"])
    assert sleeps and all("drainMs" not in q for q in sleeps)
    assert all("waitMs" in q for q in sleeps)  # the ordinary drain, as before
    assert sleep_step(op)["drainBoundMs"] is None


@pytest.mark.parametrize("side", ["east", "west"])
def test_an_engine_that_cannot_continue_on_either_side_keeps_the_full_drain(
    fleet, tick, hosts, domains, fake_clock, side
):
    binding = ModelBinding.objects.filter(domain__fleet=fleet, domain__slug=side).first()
    binding.profile = {**binding.profile, "engine": "sglang"}
    binding.save(update_fields=["profile"])
    op = promote_west(fleet, tick, domains, fake_clock)
    assert all("drainMs" not in q for q in sleep_queries(hosts.hosts["east"]))
    assert "sglang" in sleep_step(op)["drainBound"]


def test_a_binding_that_names_no_engine_keeps_the_full_drain(
    fleet, tick, hosts, domains, fake_clock
):
    ModelBinding.objects.filter(domain__fleet=fleet, domain__slug="east").update(profile={})
    promote_west(fleet, tick, domains, fake_clock)
    assert all("drainMs" not in q for q in sleep_queries(hosts.hosts["east"]))


def test_a_supervisor_without_the_drain_bound_feature_is_not_sent_one(
    fleet, tick, hosts, domains, fake_clock
):
    east = hosts.hosts["east"]
    east.features = tuple(f for f in east.features if f != "drain-bound")
    op = promote_west(fleet, tick, domains, fake_clock)
    sleeps = sleep_queries(east)
    assert sleeps and all("drainMs" not in q and "waitMs" in q for q in sleeps)
    assert "does not take a drain bound" in sleep_step(op)["drainBound"]


def test_a_demotion_never_bounds_the_drain(fleet, tick, hosts, domains, fake_clock):
    promote_west(fleet, tick, domains, fake_clock)
    east = hosts.hosts["east"]
    east.models = dict.fromkeys(east.models, False)  # awake again: the demotion must sleep it
    east.requests.clear()
    operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["east"].id)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op.kind == "demote" and op.state == "succeeded", op.error
    sleeps = sleep_queries(east)
    assert sleeps and all("drainMs" not in q for q in sleeps)
