"""POST /v1/fleets/<ref>/drill: accepted on a healthy fleet, refused clearly otherwise."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.core.states import DRILL_STEPS
from fleets.models import Domain, Fleet, Operation

pytestmark = pytest.mark.django_db

URL = "/v1/fleets/demo/drill"


@pytest.fixture
def heard(seeded_fleet):
    """Both domains answered a heartbeat just now: the standby is viable."""
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    return seeded_fleet


def post(client, body=None):
    return client.post(URL, body or {}, format="json")


def test_a_drill_of_the_viable_standby_is_accepted_as_a_drill_operation(heard, client_with_token):
    response = post(client_with_token)
    assert response.status_code == 202, response.content
    op = response.json()["operation"]
    assert op["kind"] == "drill" and op["targetDomainSlug"] == "west"
    row = Operation.objects.get(pk=op["id"])
    assert row.reason == "manual_drill" and row.kind == "drill"
    assert DRILL_STEPS == (
        "stop_training",
        "verify_gpu",
        "wake",
        "probe",
        "sleep",
        "start_training",
    )
    assert "switch_route" not in DRILL_STEPS  # routing never moves


def test_a_drill_is_refused_while_an_operation_is_in_flight(heard, client_with_token, envelope):
    promote = client_with_token.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json"
    )
    assert promote.status_code == 202
    error = envelope(post(client_with_token), 409, "operation_conflict")
    assert error["message"].startswith("no drill while an operation is in flight: promote")
    assert not Operation.objects.filter(kind="drill").exists()


def test_a_drill_is_refused_while_anything_is_degraded(heard, client_with_token, envelope):
    Domain.objects.filter(slug="east").update(state="degraded")
    error = envelope(post(client_with_token), 422, "invalid_target")
    assert "no drill while anything is degraded: east is degraded" in error["message"]
    assert not Operation.objects.exists()


def test_the_active_cannot_be_drilled_nor_a_stale_standby(
    seeded_fleet, client_with_token, envelope
):
    error = envelope(post(client_with_token, {"targetDomainId": "west"}), 422, "invalid_target")
    assert "not a viable standby" in error["message"]  # never heard from
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    error = envelope(post(client_with_token, {"targetDomainId": "east"}), 422, "invalid_target")
    assert "is the active domain" in error["message"]
    assert not Operation.objects.exists()


def test_a_round_trip_drill_is_accepted_in_its_mode(heard, client_with_token):
    Fleet.objects.filter(slug="demo").update(policy={"autoFailover": True})
    response = post(client_with_token, {"mode": "round_trip"})
    assert response.status_code == 202, response.content
    op = response.json()["operation"]
    assert op["kind"] == "drill" and op["drillMode"] == "round_trip"
    row = Operation.objects.get(pk=op["id"])
    assert row.drill_mode == "round_trip" and row.source_domain.slug == "east"


def test_a_drill_without_a_mode_is_a_check(heard, client_with_token):
    response = post(client_with_token)
    assert response.json()["operation"]["drillMode"] == "check"


def test_a_round_trip_drill_is_refused_while_auto_failover_is_off(
    heard, client_with_token, envelope
):
    Fleet.objects.filter(slug="demo").update(policy={"autoFailover": False})
    error = envelope(post(client_with_token, {"mode": "round_trip"}), 422, "invalid_target")
    assert "no round-trip drill while autoFailover is off" in error["message"]
    assert not Operation.objects.exists()


def test_an_unknown_drill_mode_is_refused(heard, client_with_token):
    response = post(client_with_token, {"mode": "both_ways"})
    assert response.status_code == 400
    assert not Operation.objects.exists()


def test_a_drill_of_another_mode_does_not_join_the_one_in_flight(
    heard, client_with_token, envelope
):
    Fleet.objects.filter(slug="demo").update(policy={"autoFailover": True})
    first = post(client_with_token, {"mode": "check"})
    assert first.status_code == 202
    again = post(client_with_token, {"mode": "check"})
    assert again.json()["operation"]["id"] == first.json()["operation"]["id"]
    envelope(post(client_with_token, {"mode": "round_trip"}), 409, "operation_conflict")
    assert Operation.objects.count() == 1
