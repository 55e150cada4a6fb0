"""POST /v1/fleets/{ref}/operations/{id}/cancel: 200 cancelled, 404 unknown, 409 too late."""

from __future__ import annotations

import uuid

import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, Operation
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_request, operation_start
from fleets.services.route_pointer import route_switch

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


def test_cancel_after_routing_moved_is_409_routing_committed(
    promotion, seeded_fleet, client_with_token, envelope
):
    east = Domain.objects.get(slug="east")
    assert route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=promotion.id,
        target_domain_id=promotion.target_domain_id,
        expected_active_id=east.id,
        expected_revision=1,
    )
    error = envelope(client_with_token.post(url(promotion.id)), 409, "routing_committed")
    assert error["operation"]["routingCommitted"] is True
    assert Operation.objects.get(pk=promotion.pk).state == "running"


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
