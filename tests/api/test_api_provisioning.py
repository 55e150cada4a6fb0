"""Operators provision and stop Haru-provisioned domains through the API; each move is an event."""

from __future__ import annotations

import pytest

from fleets.core.states import DomainState
from fleets.models import Domain, Event
from tests.drivers.managed_layout import seed_managed_fleet


@pytest.fixture
def fleet(db):
    return seed_managed_fleet()


def test_stop_then_provision_a_managed_standby(fleet, client_with_token):
    response = client_with_token.post("/v1/fleets/prov/domains/west/stop")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "accepted"
    assert body["domain"]["state"] == "stopping"
    assert body["domain"]["provisioning"]["phase"] == "teardown"
    event = Event.objects.filter(kind="domain.stopping").get()
    assert event.actor.startswith("api")

    # Asking again is what was asked: 200, nothing moves.
    again = client_with_token.post("/v1/fleets/prov/domains/west/stop")
    assert again.status_code == 200 and again.json()["status"] == "unchanged"

    # The provisioning pass confirms the teardown; then the operator provisions it again.
    Domain.objects.filter(slug="west").update(state=DomainState.STOPPED)
    response = client_with_token.post("/v1/fleets/prov/domains/west/provision")
    assert response.status_code == 202, response.content
    assert response.json()["domain"]["state"] == "provisioning"
    assert response.json()["domain"]["provisioning"]["phase"] == "launch"
    assert Event.objects.filter(kind="domain.provisioning", actor__startswith="api").exists()


def test_static_domains_and_the_active_are_refused(fleet, client_with_token, envelope):
    error = envelope(
        client_with_token.post("/v1/fleets/prov/domains/east/stop"), 409, "provision_refused"
    )
    assert "not provisioned by Haru" in error["message"]
    envelope(
        client_with_token.post("/v1/fleets/prov/domains/east/provision"), 409, "provision_refused"
    )
    # A live standby is stopped before it is provisioned again.
    error = envelope(
        client_with_token.post("/v1/fleets/prov/domains/west/provision"), 409, "provision_refused"
    )
    assert "failed or stopped" in error["message"]
    assert Domain.objects.get(slug="west").state == DomainState.PROVISIONING


def test_an_unknown_domain_is_an_invalid_target(fleet, client_with_token, envelope):
    envelope(client_with_token.post("/v1/fleets/prov/domains/north/stop"), 422, "invalid_target")


def test_the_snapshot_shows_provisioning_only_for_managed_domains(fleet, client_with_token):
    domains = {d["slug"]: d for d in client_with_token.get("/v1/fleets/prov").json()["domains"]}
    assert domains["east"]["provisioning"] is None
    assert domains["west"]["provisioning"] == {"managed": True}


def test_the_schema_documents_provision_and_stop(client_with_token):
    schema = client_with_token.get("/v1/openapi.json").json()
    ops = {
        op["operationId"]
        for path in schema["paths"].values()
        for op in path.values()
        if isinstance(op, dict) and "operationId" in op
    }
    assert {"provisionDomain", "stopDomain"} <= ops
