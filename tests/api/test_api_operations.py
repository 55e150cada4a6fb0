"""Write routes: promote and demote, every answer and every refusal in the envelope."""

from __future__ import annotations

import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Operation
from fleets.services.layouts import layout_apply

pytestmark = pytest.mark.django_db

PROMOTE = "/v1/fleets/demo/promote"
DEMOTE = "/v1/fleets/demo/demote"


def post(client, url, body, **kwargs):
    return client.post(url, body, format="json", **kwargs)


def test_promoting_the_active_is_200_already_active(seeded_fleet, client_with_token):
    response = post(client_with_token, PROMOTE, {"targetDomainId": "east"})
    assert response.status_code == 200
    assert response.json() == {"status": "already_active", "routeRevision": 1}
    assert not Operation.objects.exists()


def test_promoting_the_active_while_a_promotion_away_is_in_flight_is_409(
    seeded_fleet, client_with_token, envelope
):
    away = post(client_with_token, PROMOTE, {"targetDomainId": "west"}).json()["operation"]
    error = envelope(
        post(client_with_token, PROMOTE, {"targetDomainId": "east"}), 409, "operation_conflict"
    )
    assert error["operation"]["id"] == away["id"]
    assert Operation.objects.count() == 1


@pytest.mark.parametrize("by", ["slug", "id", "upper-case slug", "upper-case id"])
def test_promoting_a_standby_is_202_with_a_new_operation(seeded_fleet, client_with_token, by):
    west, east = Domain.objects.get(slug="west"), Domain.objects.get(slug="east")
    ref = {"slug": "west", "id": str(west.id)}[by.removeprefix("upper-case ")]
    if by.startswith("upper-case"):
        ref = ref.upper()
    response = post(client_with_token, PROMOTE, {"targetDomainId": ref})
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "accepted"
    op = body["operation"]
    assert (op["kind"], op["state"], op["targetDomainId"]) == ("promote", "pending", str(west.id))
    assert op["sourceDomainId"] == str(east.id)
    assert op["requestedBy"] == "api:api-token"
    assert Operation.objects.get().id.hex == op["id"].replace("-", "")


def test_repeating_a_promote_joins_the_same_operation(seeded_fleet, client_with_token):
    first = post(client_with_token, PROMOTE, {"targetDomainId": "west"})
    again = post(
        client_with_token,
        PROMOTE,
        {"targetDomainId": str(first.json()["operation"]["targetDomainId"])},
    )
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json()["operation"]["id"] == first.json()["operation"]["id"]
    assert Operation.objects.count() == 1
    assert Event.objects.filter(kind="operation.requested.promote").count() == 1


def test_a_different_request_while_one_is_in_flight_is_409_naming_it(
    seeded_fleet, client_with_token, envelope
):
    first = post(client_with_token, PROMOTE, {"targetDomainId": "west"}).json()["operation"]
    error = envelope(
        post(client_with_token, DEMOTE, {"targetDomainId": "west"}), 409, "operation_conflict"
    )
    assert error["operation"]["id"] == first["id"]
    assert error["operation"]["kind"] == "promote"
    assert first["id"] in error["message"]
    assert Operation.objects.count() == 1


@pytest.mark.parametrize(
    ("setup", "target", "message"),
    [
        (None, "south", "is not in fleet"),
        (None, "00000000-0000-4000-8000-000000000000", "is not in fleet"),
        ("west failed", "west", "only ready or degraded"),
        ("west unbound", "west", "no model bindings"),
    ],
)
def test_unknown_or_unpromotable_target_is_422(
    seeded_fleet, client_with_token, envelope, setup, target, message
):
    west = Domain.objects.get(slug="west")
    if setup == "west failed":
        Domain.objects.filter(pk=west.pk).update(state="failed")
    elif setup == "west unbound":
        west.bindings.all().delete()
    error = envelope(
        post(client_with_token, PROMOTE, {"targetDomainId": target}), 422, "invalid_target"
    )
    assert message in error["message"]
    assert not Operation.objects.exists()


def test_a_domain_of_another_fleet_is_422(seeded_fleet, layout_data, client_with_token, envelope):
    layout_apply(layout=parse_layout({**layout_data, "slug": "other"}))
    foreign = Domain.objects.get(fleet__slug="other", slug="west")
    response = post(client_with_token, PROMOTE, {"targetDomainId": str(foreign.id)})
    envelope(response, 422, "invalid_target")


def test_demoting_the_active_is_422(seeded_fleet, client_with_token, envelope):
    error = envelope(
        post(client_with_token, DEMOTE, {"targetDomainId": "east"}), 422, "invalid_target"
    )
    assert "active" in error["message"]
    assert not Operation.objects.exists()


def test_demoting_a_standby_is_202(seeded_fleet, client_with_token):
    response = post(client_with_token, DEMOTE, {"targetDomainId": "west"})
    assert response.status_code == 202
    op = response.json()["operation"]
    assert (op["kind"], op["state"]) == ("demote", "pending")


BAD_BODIES = {
    "missing field": ({}, "targetDomainId: This field is required."),
    "extra field": ({"targetDomainId": "west", "force": True}, "force: unknown field"),
    "null target": ({"targetDomainId": None}, "targetDomainId: This field may not be null."),
    "blank target": ({"targetDomainId": "  "}, "targetDomainId: This field may not be blank."),
    "number target": ({"targetDomainId": 7}, "targetDomainId: must be a string"),
    "list body": (["west"], "must be a JSON object (or empty), got a list"),
    "string body": ("west", "must be a JSON object (or empty), got a string"),
}


@pytest.mark.parametrize("url", [PROMOTE, DEMOTE])
@pytest.mark.parametrize("case", BAD_BODIES, ids=str)
def test_malformed_body_is_400_invalid_request(
    seeded_fleet, client_with_token, envelope, url, case
):
    body, message = BAD_BODIES[case]
    error = envelope(post(client_with_token, url, body), 400, "invalid_request")
    assert message in error["message"]
    assert not Operation.objects.exists()


def test_body_that_is_not_json_is_400(seeded_fleet, client_with_token, envelope):
    response = client_with_token.post(PROMOTE, "{not json", content_type="application/json")
    envelope(response, 400, "invalid_request")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", "targetDomainId=west"),
        ("application/x-www-form-urlencoded", "targetDomainId=west"),
        ("application/xml", "<targetDomainId>west</targetDomainId>"),
    ],
)
def test_non_json_content_type_is_415(
    seeded_fleet, client_with_token, envelope, content_type, body
):
    response = client_with_token.post(PROMOTE, body, content_type=content_type)
    envelope(response, 415, "unsupported_media_type")
    assert not Operation.objects.exists()


@pytest.mark.parametrize("size", [64 * 1024 + 1, 2 * 1024 * 1024])
def test_body_over_the_limit_is_413(seeded_fleet, client_with_token, envelope, size):
    padding = "x" * size
    response = client_with_token.post(
        PROMOTE,
        f'{{"targetDomainId": "west", "pad": "{padding}"}}',
        content_type="application/json",
    )
    envelope(response, 413, "payload_too_large")
    assert not Operation.objects.exists()


@pytest.mark.parametrize("method", ["get", "put", "patch", "delete"])
@pytest.mark.parametrize("url", [PROMOTE, DEMOTE])
def test_wrong_method_on_an_action_is_405(seeded_fleet, client_with_token, envelope, method, url):
    response = getattr(client_with_token, method)(url)
    envelope(response, 405, "method_not_allowed")


def test_wrong_method_on_a_read_route_is_405(seeded_fleet, client_with_token, envelope):
    envelope(client_with_token.post("/v1/fleets", {}, format="json"), 405, "method_not_allowed")
    envelope(client_with_token.delete("/v1/fleets/demo"), 405, "method_not_allowed")


@pytest.mark.parametrize(
    "body",
    [b"[" * 60_000, b'{"targetDomainId": "west", "targetDomainId": "east"}'],  # under the 64 KB cap
    ids=["nested-60000-deep", "repeated-key"],
)
@pytest.mark.parametrize("url", [PROMOTE, DEMOTE])
def test_hostile_json_is_a_400_envelope_and_changes_nothing(
    seeded_fleet, client_with_token, envelope, url, body
):
    response = client_with_token.post(url, data=body, content_type="application/json")
    envelope(response, 400, "invalid_request")
    assert Operation.objects.count() == 0
