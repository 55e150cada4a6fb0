"""The OpenAPI schema describes the real request and response shapes; the docs page renders it."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from drf_spectacular.validation import validate_schema

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client_with_token):
    response = client_with_token.get("/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def resolve(schema: dict, node: dict) -> dict:
    """Follow a local $ref to its component."""
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = schema["components"]["schemas"][name]
    return node


def json_body(schema: dict, content: dict) -> dict:
    return resolve(schema, content["content"]["application/json"]["schema"])


def test_schema_is_valid_openapi_3(schema):
    assert schema["openapi"].startswith("3.")
    validate_schema(schema)  # raises on any structural error


def test_schema_lists_every_api_route(schema):
    assert {
        "/v1/fleets",
        "/v1/fleets/{ref}",
        "/v1/fleets/{ref}/route-intent",
        "/v1/fleets/{ref}/promote",
        "/v1/fleets/{ref}/demote",
        "/v1/fleets/{ref}/operations",
        "/v1/operations/{operation_id}",
    } <= set(schema["paths"])
    assert "/v1/openapi.json" not in schema["paths"]


def test_promote_request_body_is_the_strict_target_request(schema):
    post = schema["paths"]["/v1/fleets/{ref}/promote"]["post"]
    body = json_body(schema, post["requestBody"])
    assert set(body["properties"]) == {"targetDomainId"}
    assert body["required"] == ["targetDomainId"]
    assert body["properties"]["targetDomainId"]["type"] == "string"
    assert set(post["responses"]) >= {"200", "202", "400", "401", "404", "409", "413", "422"}
    accepted = json_body(schema, post["responses"]["202"])
    assert set(accepted["properties"]) == {"status", "operation"}
    already = json_body(schema, post["responses"]["200"])
    assert set(already["properties"]) == {"status", "routeRevision"}
    error = json_body(schema, post["responses"]["409"])
    assert set(resolve(schema, error["properties"]["error"])["properties"]) >= {"code", "message"}


def test_fleet_response_describes_the_snapshot(schema, seeded_fleet, client_with_token):
    fleet = json_body(schema, schema["paths"]["/v1/fleets/{ref}"]["get"]["responses"]["200"])
    assert {"routeRevision", "activeDomainId", "policy", "domains", "operation"} <= set(
        fleet["properties"]
    )
    # Every key the live snapshot carries is described, at the fleet and the domain level.
    live = client_with_token.get("/v1/fleets/demo").json()
    assert set(live) == set(fleet["properties"])
    domain = resolve(schema, fleet["properties"]["domains"]["items"])
    assert set(live["domains"][0]) == set(domain["properties"])


def test_route_intent_and_operation_shapes_match_the_live_answers(
    schema, seeded_fleet, client_with_token
):
    intent = json_body(
        schema, schema["paths"]["/v1/fleets/{ref}/route-intent"]["get"]["responses"]["200"]
    )
    live = client_with_token.get("/v1/fleets/demo/route-intent").json()
    # Without a split the answer is what it always was: every key it carries is required, and
    # the only optional ones are the splits'.
    assert set(live) == set(intent["required"])
    assert set(intent["properties"]) - set(live) == {"splits", "splitFaults"}
    created = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    ).json()
    operation = json_body(
        schema, schema["paths"]["/v1/operations/{operation_id}"]["get"]["responses"]["200"]
    )
    assert set(created["operation"]) == set(operation["properties"])


def test_schema_declares_bearer_auth(schema):
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["bearerToken"]["description"],
    }


def test_schema_generates_without_warnings(tmp_path):
    # --fail-on-warn turns any shape drf-spectacular had to guess into an error.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.json"))


def test_docs_page_renders_with_local_assets(client_with_token):
    response = client_with_token.get("/v1/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html.lower()
    assert "/v1/openapi.json" in html
    assert "cdn." not in html and "unpkg.com" not in html  # closed networks: no CDN


def operations(schema: dict) -> list[tuple[str, str, dict]]:
    return [
        (path, method, op)
        for path, methods in schema["paths"].items()
        for method, op in methods.items()
    ]


def test_every_operation_has_a_summary_and_a_description(schema):
    """Issue 28: the page listed bare paths; an operator reads what each call does."""
    bare = [
        f"{method} {path}"
        for path, method, op in operations(schema)
        if not op.get("summary") or not op.get("description")
    ]
    assert bare == []


def test_path_parameters_say_what_they_accept(schema):
    """`ref` takes an id or a slug; every path parameter says so, not just `string`."""
    undescribed = [
        f"{method} {path} {p['name']}"
        for path, method, op in operations(schema)
        for p in op.get("parameters", ())
        if not p.get("description")
    ]
    assert undescribed == []
    ref = next(
        p for p in schema["paths"]["/v1/fleets/{ref}"]["get"]["parameters"] if p["name"] == "ref"
    )
    assert ref["in"] == "path" and "slug" in ref["description"]


def test_the_operations_limit_is_documented(schema, seeded_fleet, client_with_token):
    params = schema["paths"]["/v1/fleets/{ref}/operations"]["get"]["parameters"]
    limit = next(p for p in params if p["name"] == "limit")
    assert limit["in"] == "query" and limit["schema"]["type"] == "integer"
    assert limit["schema"]["default"] == 50 and "1 to 500" in limit["description"]
    # What the description says is what the view does: clamped, and a non-number is the default.
    created = client_with_token.post(
        "/v1/fleets/demo/demote", {"targetDomainId": "west"}, format="json"
    )
    assert created.status_code == 202
    for query in ("?limit=0", "?limit=1", "?limit=9999", "?limit=x"):
        response = client_with_token.get(f"/v1/fleets/demo/operations{query}")
        assert response.status_code == 200 and len(response.json()["operations"]) == 1, query


def test_the_chat_proxys_paths_are_in_the_schema(schema):
    """The OpenAI-compatible paths the proxy serves ahead of Django, with their shapes."""
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    body = json_body(schema, chat["requestBody"])
    assert body["required"] == ["model", "messages"] and body["additionalProperties"] is True
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert {"401", "404", "503"} <= set(chat["responses"])
    assert chat["security"] == [{"bearerToken": []}, {"chatToken": []}]
    assert "X-Haru-Fleet" in [p["name"] for p in chat["parameters"]]
    completion = json_body(schema, schema["paths"]["/v1/completions"]["post"]["requestBody"])
    assert "prompt" in completion["required"]
    listing = json_body(schema, schema["paths"]["/v1/models"]["get"]["responses"]["200"])
    model = resolve(schema, listing["properties"]["data"]["items"])
    assert set(model["properties"]) == {"id", "object", "created", "owned_by"}
    assert "/v1/models/{model}" in schema["paths"]
    assert schema["components"]["securitySchemes"]["chatToken"]["scheme"] == "bearer"


def test_every_path_the_proxy_serves_is_described():
    """The hook cannot import the proxy (both are entry points): this holds them together."""
    from fleets.api.openapi_hooks import CHAT_PATHS, MODEL_PREFIX  # noqa: PLC0415
    from fleets.proxy import handler  # noqa: PLC0415

    assert MODEL_PREFIX == handler.MODEL_PREFIX
    assert set(CHAT_PATHS) == {*handler.ENDPOINTS, f"{handler.MODEL_PREFIX}{{model}}"}


def test_the_models_list_matches_what_the_proxy_answers(schema):
    from fleets.proxy import handler  # noqa: PLC0415

    live = handler._model_object("qwen-small")
    model = schema["components"]["schemas"]["OpenAIModel"]
    assert set(live) == set(model["properties"]) == set(model["required"])


def test_route_intent_splits_match_the_schema(schema, seeded_fleet, client_with_token):
    from fleets.models import Domain, Fleet  # noqa: PLC0415

    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    Fleet.objects.filter(pk=seeded_fleet.pk).update(
        route_splits={
            "qwen-small": {
                "rollout": "8c1e0000-0000-4000-8000-000000000001",
                "candidateDomain": str(west.id),
                "weightPermille": 50,
                "stickyHeader": "",
            },
            "llama-small": {"weightPermille": "lots"},
        }
    )
    intent = json_body(
        schema, schema["paths"]["/v1/fleets/{ref}/route-intent"]["get"]["responses"]["200"]
    )
    live = client_with_token.get("/v1/fleets/demo/route-intent").json()
    assert set(live) == set(intent["properties"])
    split = resolve(schema, intent["properties"]["splits"]["items"])
    assert set(live["splits"][0]) == set(split["properties"])
    arm = resolve(schema, split["properties"]["arms"]["items"])
    assert set(live["splits"][0]["arms"][0]) == set(arm["properties"])
    fault = resolve(schema, intent["properties"]["splitFaults"]["items"])
    assert set(live["splitFaults"][0]) == set(fault["properties"])
