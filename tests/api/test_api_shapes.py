"""Every live answer is valid against the OpenAPI schema's description of its shape.

The bodies are rendered by `fleets/reads/shapes.py` and described by `fleets/api/serializers.py`;
these tests turn the published OpenAPI components into JSON Schema (closed objects, `nullable`
as a null alternative, formats checked) and validate the real answers against them, so a key,
a type or an enum choice that drifts on either side fails here.
"""

from __future__ import annotations

import copy

import jsonschema
import pytest

from fleets.models import Fleet, Operation
from fleets.reads.shapes import LIVE_OPERATION_KEYS
from fleets.services import broadcast

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client_with_token):
    response = client_with_token.get("/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def as_json_schema(openapi: dict, node: object) -> object:
    """Inline `$ref`s and translate OpenAPI 3.0's dialect into JSON Schema, strictly."""
    if isinstance(node, list):
        return [as_json_schema(openapi, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return as_json_schema(openapi, openapi["components"]["schemas"][name])
    out = {key: as_json_schema(openapi, value) for key, value in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False  # a key the schema does not name is drift
    if out.pop("nullable", False):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def response_schema(openapi: dict, path: str, method: str, status: str) -> dict:
    content = openapi["paths"][path][method]["responses"][status]["content"]
    return as_json_schema(openapi, content["application/json"]["schema"])


def assert_valid(instance: object, schema: dict) -> None:
    jsonschema.validate(instance, schema, format_checker=jsonschema.FormatChecker())


def test_the_fleet_snapshot_with_an_operation_in_flight_matches_its_schema(
    schema, seeded_fleet, client_with_token
):
    accepted = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    )
    assert accepted.status_code == 202
    assert_valid(
        accepted.json(), response_schema(schema, "/v1/fleets/{ref}/promote", "post", "202")
    )
    live = client_with_token.get("/v1/fleets/demo").json()
    assert live["operation"] is not None
    kinds = {slot["kind"] for domain in live["domains"] for slot in domain["slots"]}
    assert len(kinds) > 1  # inference slots (models) and trainers (pids) both checked
    assert_valid(live, response_schema(schema, "/v1/fleets/{ref}", "get", "200"))


@pytest.mark.parametrize(
    ("path", "url"),
    [
        ("/v1/fleets", "/v1/fleets"),
        ("/v1/fleets/{ref}", "/v1/fleets/demo"),
        ("/v1/fleets/{ref}/route-intent", "/v1/fleets/demo/route-intent"),
    ],
)
def test_each_fleet_read_matches_its_schema(schema, seeded_fleet, client_with_token, path, url):
    response = client_with_token.get(url)
    assert response.status_code == 200
    assert_valid(response.json(), response_schema(schema, path, "get", "200"))


def test_operation_reads_match_their_schemas(schema, seeded_fleet, client_with_token):
    created = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    ).json()["operation"]
    one = client_with_token.get(f"/v1/operations/{created['id']}").json()
    assert_valid(one, response_schema(schema, "/v1/operations/{operation_id}", "get", "200"))
    listed = client_with_token.get("/v1/fleets/demo/operations").json()
    assert_valid(listed, response_schema(schema, "/v1/fleets/{ref}/operations", "get", "200"))


def test_a_drifted_answer_fails_the_schema(schema, seeded_fleet, client_with_token):
    # The check can fail: an extra key, a wrong type and a choice the enums lack are each caught.
    live = client_with_token.get("/v1/fleets/demo").json()
    fleet_schema = response_schema(schema, "/v1/fleets/{ref}", "get", "200")
    for drift in (
        lambda body: body.update(extra=1),
        lambda body: body.update(routeRevision="7"),
        lambda body: body["domains"][0].update(state="napping"),
    ):
        body = copy.deepcopy(live)
        drift(body)
        with pytest.raises(jsonschema.ValidationError):
            assert_valid(body, fleet_schema)


def test_the_live_message_renders_its_operation_like_the_api(
    schema, seeded_fleet, client_with_token
):
    created = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    ).json()["operation"]
    Operation.objects.filter(pk=created["id"]).update(error={"code": "x", "message": "y"})
    api = client_with_token.get(f"/v1/operations/{created['id']}").json()
    state = broadcast.fleet_state(Fleet.objects.get(slug="demo").id, created["id"])
    assert state["operation"] == {key: api[key] for key in LIVE_OPERATION_KEYS}
    summary = client_with_token.get("/v1/fleets").json()["fleets"][0]
    assert {key: state[key] for key in state if key != "operation"} == {
        key: summary[key] for key in ("id", "slug", "activeDomainId", "routeRevision")
    }


@pytest.mark.parametrize("action", ["promote", "demote"])
def test_request_bodies_refuse_unknown_fields_in_the_schema_and_in_behaviour(
    schema, seeded_fleet, client_with_token, action
):
    # The published schema, as written (not closed by as_json_schema): what a generated client
    # would read. It must say what the server does with an unknown field: refuse it.
    path = f"/v1/fleets/{{ref}}/{action}"
    ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    body_schema = schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[-1]]
    assert body_schema["additionalProperties"] is False
    extra = {"targetDomainId": "west", "force": True}
    assert (
        list(jsonschema.Draft202012Validator(body_schema).iter_errors({"targetDomainId": "west"}))
        == []
    )
    assert list(jsonschema.Draft202012Validator(body_schema).iter_errors(extra))
    response = client_with_token.post(f"/v1/fleets/demo/{action}", extra, format="json")
    assert response.status_code == 400
    assert "force: unknown field" in response.json()["error"]["message"]
    assert not Operation.objects.exists()
