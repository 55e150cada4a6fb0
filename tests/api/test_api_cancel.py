"""POST /v1/fleets/{ref}/operations/{id}/cancel: 200 cancelled (or, after routing moved, 200
succeeded without the remaining best-effort steps), 404 unknown, 409 too late."""

from __future__ import annotations

import uuid

import pytest

from fleets.base import clock
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, Operation
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_request, operation_start, operation_step_done
from fleets.services.route_pointer import route_switch
from tests.api.test_api_shapes import assert_valid, response_schema

pytestmark = pytest.mark.django_db


def url(op_id: object, fleet: str = "demo") -> str:
    return f"/v1/fleets/{fleet}/operations/{op_id}/cancel"


@pytest.fixture
def promotion(seeded_fleet):
    west = Domain.objects.get(slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    return op


def test_cancel_ends_the_operation_and_names_the_clean_up(promotion, client_with_token):
    response = client_with_token.post(url(promotion.id))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled"
    assert body["operation"]["id"] == str(promotion.id)
    assert body["operation"]["state"] == "cancelled"
    assert body["operation"]["cleanup"] == "pending"
    assert body["operation"]["error"]["code"] == "cancelled"
    event = Event.objects.get(operation=promotion, kind="operation.cancelled")
    assert event.actor.startswith("api")


def test_cancel_of_a_finished_operation_is_409_and_changes_nothing(
    promotion, client_with_token, envelope
):
    assert client_with_token.post(url(promotion.id)).status_code == 200
    before = Operation.objects.get(pk=promotion.pk).finished_at
    error = envelope(client_with_token.post(url(promotion.id)), 409, "operation_finished")
    assert error["operation"]["state"] == "cancelled"
    assert Operation.objects.get(pk=promotion.pk).finished_at == before
    assert Event.objects.filter(operation=promotion, kind="operation.cancelled").count() == 1


def _switched(fleet, promotion, *, recorded: bool) -> None:
    """Move routing for `promotion`; `recorded`: its switch step is on record too (the promotion
    is at its first best-effort step on the old active)."""
    Operation.objects.filter(pk=promotion.pk).update(current_step="switch_route")
    assert route_switch(
        fleet_id=fleet.id,
        operation_id=promotion.id,
        target_domain_id=promotion.target_domain_id,
        expected_active_id=Domain.objects.get(slug="east").id,
        expected_revision=1,
    )
    if recorded:
        assert operation_step_done(operation_id=promotion.id, step="switch_route")


def test_cancel_after_routing_moved_ends_the_promotion_succeeded_without_its_best_effort_steps(
    promotion, seeded_fleet, client_with_token
):
    _switched(seeded_fleet, promotion, recorded=True)

    response = client_with_token.post(url(promotion.id))

    assert response.status_code == 200, response.content
    body = response.json()
    # What happened, said plainly: routing had moved, so it is not a cancelled promotion.
    assert body["status"] == "succeeded"
    assert body["skippedSteps"] == ["demote_old_sleep", "demote_old_train"]
    assert body["operation"]["state"] == "succeeded"
    assert body["operation"]["routingCommitted"] is True
    assert body["operation"]["error"] is None and body["operation"]["cleanup"] is None
    skipped = Event.objects.filter(operation=promotion, kind="operation.step.skipped")
    assert [(e.step, e.data["reason"]) for e in skipped.order_by("id")] == [
        ("demote_old_sleep", "cancelled"),
        ("demote_old_train", "cancelled"),
    ]
    assert all(e.actor.startswith("api") for e in skipped)
    assert not Event.objects.filter(operation=promotion, kind="operation.cancelled").exists()
    assert Fleet.objects.get(pk=seeded_fleet.pk).active_domain.slug == "west"  # routing stays


def test_a_second_cancel_of_a_promotion_that_skipped_its_steps_is_409_operation_finished(
    promotion, seeded_fleet, client_with_token, envelope
):
    _switched(seeded_fleet, promotion, recorded=True)
    assert client_with_token.post(url(promotion.id)).status_code == 200
    error = envelope(client_with_token.post(url(promotion.id)), 409, "operation_finished")
    assert error["operation"]["state"] == "succeeded"
    assert Event.objects.filter(operation=promotion, kind="operation.step.skipped").count() == 2


def test_cancel_between_the_switch_and_its_record_is_409_routing_committed(
    promotion, seeded_fleet, client_with_token, envelope
):
    # The pointer moved a moment ago and the switch step is not on record yet: nothing is
    # ended (its failover time is still to be recorded); the operator retries.
    _switched(seeded_fleet, promotion, recorded=False)
    error = envelope(client_with_token.post(url(promotion.id)), 409, "routing_committed")
    assert error["operation"]["routingCommitted"] is True
    assert "retry" in error["message"]
    assert Operation.objects.get(pk=promotion.pk).state == "running"


@pytest.mark.parametrize("committed", [False, True])
def test_both_answers_match_the_openapi_schema(
    promotion, seeded_fleet, client_with_token, committed
):
    if committed:
        _switched(seeded_fleet, promotion, recorded=True)
    body = client_with_token.post(url(promotion.id)).json()
    assert body["status"] == ("succeeded" if committed else "cancelled")
    assert body["skippedSteps"] == (["demote_old_sleep", "demote_old_train"] if committed else [])
    schema = client_with_token.get("/v1/openapi.json").json()
    path = "/v1/fleets/{ref}/operations/{operation_id}/cancel"
    assert_valid(body, response_schema(schema, path, "post", "200"))


def test_a_promotion_past_its_switch_says_when_clients_were_served_while_it_still_runs(
    fake_clock, promotion, seeded_fleet, client_with_token
):
    _switched(seeded_fleet, promotion, recorded=True)
    served = clock.iso(clock.now())
    fake_clock.advance(seconds=17)  # its best-effort sleep of the old active retries meanwhile

    response = client_with_token.get(f"/v1/operations/{promotion.id}")

    body = response.json()
    assert body["state"] == "running" and body["currentStep"] == "demote_old_sleep"
    assert body["routingCommitted"] is True and body["servedAt"] == served
    schema = client_with_token.get("/v1/openapi.json").json()
    assert_valid(body, response_schema(schema, "/v1/operations/{operation_id}", "get", "200"))
    fields = schema["components"]["schemas"]["OperationOut"]["properties"]
    assert fields["servedAt"]["format"] == "date-time" and fields["servedAt"]["nullable"]


@pytest.mark.parametrize("ref", [str(uuid.UUID(int=7)), "not-a-uuid"])
def test_unknown_operation_is_404(seeded_fleet, client_with_token, envelope, ref):
    envelope(client_with_token.post(url(ref)), 404, "operation_not_found")


def test_an_operation_of_another_fleet_is_404_and_stays_running(
    promotion, layout_data, client_with_token, envelope
):
    layout_apply(layout=parse_layout({**layout_data, "slug": "other"}))
    envelope(client_with_token.post(url(promotion.id, "other")), 404, "operation_not_found")
    assert Operation.objects.get(pk=promotion.pk).state == "running"


def test_unknown_fleet_is_404(promotion, client_with_token, envelope):
    envelope(client_with_token.post(url(promotion.id, "nope")), 404, "fleet_not_found")


def test_cancel_needs_the_token(promotion, api_client, api_token, envelope):
    envelope(api_client.post(url(promotion.id)), 401, "unauthorized")
    assert Operation.objects.get(pk=promotion.pk).state == "running"


def test_cancel_is_described_in_the_openapi_schema(client_with_token, promotion):
    schema = client_with_token.get("/v1/openapi.json").json()
    post = schema["paths"]["/v1/fleets/{ref}/operations/{operation_id}/cancel"]["post"]
    assert post["operationId"] == "cancelOperation"
    assert {"200", "401", "404", "409"} <= set(post["responses"])
    assert Fleet.objects.count() == 1
