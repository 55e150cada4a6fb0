"""The dashboard's cancel button and the backoff line: staff only, CSRF, the API's answers."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from fleets.base import clock
from fleets.models import Domain, Operation
from fleets.services.operations import (
    operation_fail,
    operation_request,
    operation_start,
    operation_step_done,
)
from fleets.services.route_pointer import route_switch

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(
        "ops", password="pw-ops-1234", is_staff=True, is_superuser=True
    )


@pytest.fixture
def staff_client(staff):
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def running(seeded_fleet) -> Operation:
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    return op


def cancel(client, op_id, **extra):
    return client.post("/fleets/demo/actions/cancel/", {"target": str(op_id), **extra}, follow=True)


def test_the_in_flight_operation_has_a_cancel_button(staff_client, running):
    html = staff_client.get("/fleets/demo/live/").content.decode()
    assert 'data-action="cancel"' in html
    assert f'name="target" value="{running.id}"' in html


def test_cancel_asks_first_then_cancels_and_says_so(staff_client, running):
    page = staff_client.post("/fleets/demo/actions/cancel/", {"target": str(running.id)})
    assert b"Confirm: cancel" in page.content
    assert Operation.objects.get(pk=running.pk).state == "running"

    response = cancel(staff_client, running.id, confirm="on")
    op = Operation.objects.get(pk=running.pk)
    assert op.state == "cancelled" and op.cleanup == "pending"
    text = response.content.decode()
    assert f"promote of west cancelled (operation {str(op.id)[:8]})" in text
    html = staff_client.get("/fleets/demo/live/").content.decode()
    assert 'data-action="cancel"' not in html  # nothing left to cancel
    assert 'data-operation-cleanup="pending"' in html


def test_cancel_of_a_finished_operation_shows_the_apis_409(staff_client, running):
    operation_fail(operation_id=running.id, step="probe", code="probe_failed", message="x")
    response = staff_client.post(
        "/fleets/demo/actions/cancel/",
        {"target": str(running.id), "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "operation_finished"


def test_cancel_needs_a_csrf_token_and_staff(staff, running, django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    refused = client.post(
        "/fleets/demo/actions/cancel/", {"target": str(running.id), "confirm": "on"}
    )
    assert refused.status_code == 403
    assert Operation.objects.get(pk=running.pk).state == "running"

    plain = django_user_model.objects.create_user("guest", password="pw-guest-1234")
    other = Client()
    other.force_login(plain)
    assert cancel(other, running.id, confirm="on").status_code == 403
    assert Operation.objects.get(pk=running.pk).state == "running"

    page = client.get("/fleets/demo/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]
    done = client.post(
        "/fleets/demo/actions/cancel/",
        {"target": str(running.id), "confirm": "on", "csrfmiddlewaretoken": token},
    )
    assert done.status_code == 302
    assert Operation.objects.get(pk=running.pk).state == "cancelled"


def test_cancel_without_an_operation_is_refused(staff_client, running):
    response = staff_client.post(
        "/fleets/demo/actions/cancel/", {"confirm": "on"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 400
    assert Operation.objects.get(pk=running.pk).state == "running"


def test_a_standby_backing_off_says_when_it_is_tried_again(staff_client, seeded_fleet, fake_clock):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(
        fleet=seeded_fleet, kind="promote", target_domain_id=west.id, reason="auto_failover"
    ).operation
    operation_start(operation_id=op.id)
    operation_fail(operation_id=op.id, step="probe", code="probe_failed", message="boom")
    fake_clock.advance(ms=5000)

    html = staff_client.get("/fleets/demo/live/").content.decode()
    op.refresh_from_db()
    due = clock.iso(op.finished_at + timedelta(milliseconds=15_000))
    assert f'data-next-attempt-at="{due}"' in html
    assert "1 failed automatic promotion in a row; auto-failover tries it again in 10.0s" in html

    fake_clock.advance(ms=10_000)
    assert "data-failover-backoff" not in staff_client.get("/fleets/demo/live/").content.decode()


def _at_best_effort_step(op: Operation) -> None:
    """Routing moved for `op` and its switch is on record: the old active's steps remain."""
    Operation.objects.filter(pk=op.pk).update(current_step="switch_route")
    assert route_switch(
        fleet_id=op.fleet_id,
        operation_id=op.id,
        target_domain_id=op.target_domain_id,
        expected_active_id=op.source_domain_id,
        expected_revision=1,
    )
    assert operation_step_done(operation_id=op.id, step="switch_route")


def test_a_promotion_that_moved_routing_offers_to_skip_its_remaining_steps(staff_client, running):
    _at_best_effort_step(running)
    html = staff_client.get("/fleets/demo/live/").content.decode()
    assert "data-cancel-skips-rest" in html and "Skip remaining steps" in html

    response = cancel(staff_client, running.id, confirm="on")

    op = Operation.objects.get(pk=running.pk)
    assert op.state == "succeeded" and op.cleanup == ""
    text = response.content.decode()
    assert "promote of west had already moved routing: it ends succeeded without" in text
    assert "demote_old_sleep, demote_old_train" in text
    steps = staff_client.get("/fleets/demo/live/").content.decode()
    assert 'data-step="demote_old_sleep" data-step-status="warn"' in steps
    assert 'data-action="cancel"' not in steps


def test_the_json_answer_of_skipping_says_succeeded(staff_client, running):
    _at_best_effort_step(running)
    response = staff_client.post(
        "/fleets/demo/actions/cancel/",
        {"target": str(running.id), "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"
