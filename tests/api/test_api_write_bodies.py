"""Every write route takes a JSON object or no body: any other JSON value is 400 and changes
nothing (issue 29: a `null` body was read as "no body", and the drill and baselines ran)."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.models import Domain, Event, GoldenBaseline, Operation
from tests.drivers.managed_layout import seed_managed_fleet

pytestmark = pytest.mark.django_db

NOT_OBJECTS = ["null", "[]", "[{}]", "0", "false", '""', '"drill"']


def _post(client, url: str, raw: str):
    return client.generic("POST", url, raw, content_type="application/json")


def _state() -> tuple:
    """What a write could change: operations (with their states), events, baselines, domain
    states."""
    return (
        sorted(Operation.objects.values_list("id", "state")),
        Event.objects.count(),
        GoldenBaseline.objects.count(),
        sorted(
            Domain.objects.values_list(
                "slug", "state", "state_updated_at", "driver_status", "provision_attempt"
            )
        ),
    )


@pytest.fixture
def heard(seeded_fleet):
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    return seeded_fleet


@pytest.mark.parametrize("raw", NOT_OBJECTS)
@pytest.mark.parametrize("path", ["drill", "baselines", "promote", "demote", "reconcile"], ids=str)
def test_a_fleet_write_refuses_a_body_that_is_not_an_object(
    heard, client_with_token, envelope, path, raw
):
    before = _state()
    error = envelope(
        _post(client_with_token, f"/v1/fleets/demo/{path}", raw), 400, "invalid_request"
    )
    assert "must be a JSON object" in error["message"]
    assert _state() == before


@pytest.mark.parametrize("raw", NOT_OBJECTS)
def test_a_cancel_refuses_a_body_that_is_not_an_object(heard, client_with_token, envelope, raw):
    promote = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    )
    op = promote.json()["operation"]["id"]
    before = _state()
    response = _post(client_with_token, f"/v1/fleets/demo/operations/{op}/cancel", raw)
    envelope(response, 400, "invalid_request")
    assert _state() == before


@pytest.mark.parametrize("raw", NOT_OBJECTS)
@pytest.mark.parametrize("move", ["stop", "provision"])
def test_a_provisioning_move_refuses_a_body_that_is_not_an_object(
    client_with_token, envelope, move, raw
):
    seed_managed_fleet()
    before = _state()
    response = _post(client_with_token, f"/v1/fleets/prov/domains/west/{move}", raw)
    envelope(response, 400, "invalid_request")
    assert _state() == before


@pytest.mark.parametrize("raw", ["", "{}"])
def test_no_body_or_an_empty_object_still_takes_the_defaults(heard, client_with_token, raw):
    drill = _post(client_with_token, "/v1/fleets/demo/drill", raw)
    assert drill.status_code == 202, drill.content
    assert drill.json()["operation"]["targetDomainSlug"] == "west"
