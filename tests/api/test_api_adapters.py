"""The adapters' routes: the registry's view, pin and unpin, and adapter rollouts through the
rollouts routes, with every refusal in the envelope and nothing changed by a refused request."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleets.base import clock
from fleets.core.access import TokenScope
from fleets.core.adapter_route import AdapterRoute, adapter_routes_parse
from fleets.models import AdapterCopy, AdapterVersion, Domain, Fleet, Rollout
from fleets.services.access import api_token_create
from fleets.services.adapter_routes import adapter_route_set

pytestmark = pytest.mark.django_db

BASE = "qwen-small"
NAME = "support-bot"
URL = "/v1/fleets/demo/adapters"


def version(fleet, number: int, *, copy_state: str = "probed", served: bool = False):
    now = clock.now()
    row = AdapterVersion.objects.create(
        fleet=fleet,
        name=NAME,
        version=number,
        base_model=BASE,
        digest=f"sha256:{number:064x}",
        size_bytes=1000 * number,
        manifest={"rank": 8, "training": {"steps": 40 * number, "loss": 1.5}},
        checkpoint=f"step-{number:06d}",
        completed_at=now - timedelta(hours=10 - number),
        registered_at=now,
        first_served_at=now - timedelta(hours=9 - number) if served else None,
    )
    for domain in Domain.objects.filter(fleet=fleet):
        AdapterCopy.objects.create(adapter=row, domain=domain, state=copy_state, updated_at=now)
    return row


def route_to(fleet, route: AdapterRoute) -> None:
    revision = Fleet.objects.get(pk=fleet.id).route_revision
    assert adapter_route_set(
        fleet_id=fleet.id, name=NAME, route=route, expected_revision=revision, actor="test"
    )


def route_now(fleet) -> AdapterRoute:
    return adapter_routes_parse(Fleet.objects.get(pk=fleet.id).adapter_routes)[NAME]


@pytest.fixture
def adapters(seeded_fleet, fake_clock):
    version(seeded_fleet, 1, served=True)
    version(seeded_fleet, 2)
    route_to(seeded_fleet, AdapterRoute(base=BASE, version=1))
    return seeded_fleet


def refused(response, status: int, code: str) -> dict:
    """The error envelope (a 400 also names the field at fault)."""
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    assert set(error) <= {"code", "message", "field"}, error
    return error


def post(client, url, data=None):
    return client.post(url, data if data is not None else {}, format="json")


def test_the_list_shows_versions_copies_route_and_freshness(adapters, client_with_token):
    response = client_with_token.get(URL)
    assert response.status_code == 200, response.json()
    (adapter,) = response.json()["adapters"]
    assert adapter["name"] == NAME
    assert adapter["route"]["version"] == 1 and adapter["route"]["pinned"] is False
    assert [v["version"] for v in adapter["versions"]] == [2, 1]
    v2 = adapter["versions"][0]
    assert v2["training"] == {"steps": 80, "loss": 1.5} and v2["sizeBytes"] == 2000
    assert sorted(c["domain"] for c in v2["copies"]) == ["east", "west"]
    assert {c["state"] for c in v2["copies"]} == {"probed"}
    # v1 completed 9 h ago and is what users get; it first answered an hour after completion.
    assert adapter["freshness"]["servedAgeS"] == 9 * 3600
    assert adapter["freshness"]["checkpointToFirstTokenS"] == 3600
    detail = client_with_token.get(f"{URL}/{NAME}").json()
    assert detail == adapter


def test_an_unknown_adapter_is_404_in_the_envelope(adapters, client_with_token, envelope):
    envelope(client_with_token.get(f"{URL}/nope"), 404, "adapter_not_found")


def test_pin_routes_every_request_to_the_version_and_unpin_keeps_it(adapters, client_with_token):
    response = post(client_with_token, f"{URL}/{NAME}/pin", {"version": 2})
    assert response.status_code == 200, response.json()
    assert response.json()["version"] == 2 and response.json()["pinned"] is True
    assert route_now(adapters) == AdapterRoute(base=BASE, version=2, pinned=True)
    response = post(client_with_token, f"{URL}/{NAME}/unpin")
    assert response.status_code == 200
    assert route_now(adapters) == AdapterRoute(base=BASE, version=2)


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        ({"version": 9}, 404, "adapter_not_found"),
        ({"version": 0}, 400, "invalid_request"),
        ({"version": "2"}, 400, "invalid_request"),
        ({"version": 2, "force": True}, 400, "invalid_request"),
        ({}, 400, "invalid_request"),
    ],
)
def test_a_bad_pin_changes_nothing(adapters, client_with_token, data, status, code):
    before = Fleet.objects.get(pk=adapters.id)
    refused(post(client_with_token, f"{URL}/{NAME}/pin", data), status, code)
    after = Fleet.objects.get(pk=adapters.id)
    assert (after.adapter_routes, after.route_revision) == (
        before.adapter_routes,
        before.route_revision,
    )


def test_pin_refuses_a_version_not_probed_on_the_active(adapters, client_with_token, envelope):
    version(adapters, 3, copy_state="loaded")
    envelope(post(client_with_token, f"{URL}/{NAME}/pin", {"version": 3}), 422, "invalid_target")
    assert route_now(adapters).version == 1


def test_pin_is_refused_while_an_adapter_rollout_of_that_name_runs(
    adapters, client_with_token, envelope
):
    started = post(
        client_with_token,
        "/v1/fleets/demo/rollouts",
        {"candidate": {"kind": "adapter", "adapter": NAME, "version": 2}},
    )
    assert started.status_code == 202, started.json()
    assert started.json()["model"] == NAME and started.json()["candidate"]["version"] == 2
    envelope(post(client_with_token, f"{URL}/{NAME}/pin", {"version": 1}), 409, "rollout_conflict")
    assert route_now(adapters) == AdapterRoute(base=BASE, version=1)
    # The rollout's actions are the rollouts' own.
    rollout_id = started.json()["id"]
    aborted = post(client_with_token, f"/v1/fleets/demo/rollouts/{rollout_id}/abort")
    assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"


@pytest.mark.parametrize(
    ("candidate", "status", "code"),
    [
        ({"kind": "adapter", "adapter": NAME, "version": 9}, 404, "adapter_not_found"),
        ({"kind": "adapter", "adapter": NAME, "version": 1}, 422, "invalid_target"),
        ({"kind": "adapter", "adapter": "Bad Name", "version": 2}, 400, "invalid_request"),
        ({"kind": "adapter", "adapter": NAME, "version": 2, "profile": {}}, 400, "invalid_request"),
        ({"kind": "adapter", "adapter": "other", "version": 1}, 404, "adapter_not_found"),
    ],
)
def test_a_bad_adapter_rollout_changes_nothing(
    adapters, client_with_token, candidate, status, code
):
    response = post(client_with_token, "/v1/fleets/demo/rollouts", {"candidate": candidate})
    refused(response, status, code)
    assert not Rollout.objects.exists()


def test_reading_needs_read_and_pinning_needs_operate(adapters, api_client, api_token, envelope):
    token = api_token_create(name="reader", scope=TokenScope.READ, fleets=[adapters])[1]
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api_client.get(URL).status_code == 200
    envelope(post(api_client, f"{URL}/{NAME}/pin", {"version": 2}), 403, "forbidden")
    envelope(post(api_client, f"{URL}/{NAME}/unpin"), 403, "forbidden")
    assert route_now(adapters).version == 1
    api_client.credentials()
    envelope(api_client.get(URL), 401, "unauthorized")


def test_the_openapi_schema_documents_the_adapter_routes(client_with_token):
    paths = client_with_token.get("/v1/openapi.json").json()["paths"]
    assert "get" in paths["/v1/fleets/{ref}/adapters"]
    assert "get" in paths["/v1/fleets/{ref}/adapters/{name}"]
    pin = paths["/v1/fleets/{ref}/adapters/{name}/pin"]["post"]
    assert {"200", "400", "404", "409", "422"} <= set(pin["responses"])
    assert "post" in paths["/v1/fleets/{ref}/adapters/{name}/unpin"]
