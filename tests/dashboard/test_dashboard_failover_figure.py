"""The fleet page shows a failover's one figure, and the steps after its switch apart (issue 28)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from fleets.base import clock
from fleets.models import Domain, Operation
from fleets.services.operations import operation_request, operation_start, operation_step_done
from fleets.services.route_pointer import route_switch

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(django_user_model):
    staff = django_user_model.objects.create_user(
        "ops", password="pw-ops-1234", is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def failover(seeded_fleet, fake_clock) -> Operation:
    """An operator's promotion of west away from east, failed 3 s after its last good sign."""
    Domain.objects.filter(fleet=seeded_fleet, slug="east").update(
        state="failed", last_seen_at=fake_clock.now() - timedelta(seconds=3)
    )
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    for step in ("stop_training", "verify_gpu", "wake", "probe"):
        fake_clock.advance(ms=250)
        operation_step_done(operation_id=op.id, step=step)
    assert route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=op.id,
        target_domain_id=west.id,
        expected_active_id=op.source_domain_id,
        expected_revision=1,
    )
    operation_step_done(operation_id=op.id, step="switch_route")
    op.refresh_from_db()
    return op


def test_the_outage_start_is_recorded_for_an_operators_promotion_away_from_a_failed_active(
    failover, fake_clock
):
    assert failover.reason == "manual" and failover.source_state == "failed"
    assert failover.detected_at == clock.now() - timedelta(seconds=4)
    assert failover.served_at == clock.now()


def test_while_its_steps_on_the_old_active_run_the_page_says_clients_are_served(
    staff_client, failover, fake_clock
):
    fake_clock.advance(seconds=17)  # the old active's sleep retries against a dead host

    html = staff_client.get("/fleets/demo/live/").content.decode()

    assert f'data-operation-served="{clock.iso(failover.served_at)}"' in html
    assert "clients served by west since 00:00:01 UTC · failover 4.0 s" in html
    assert "the steps left act on east only" in html
    # Still running, so the operator may still end it early.
    assert 'data-operation-state="running"' in html and "Skip remaining steps" in html


def test_the_chart_bar_is_the_figure_and_the_steps_after_the_switch_stand_apart(
    staff_client, failover, fake_clock
):
    fake_clock.advance(seconds=17)
    operation_step_done(
        operation_id=failover.id, step="demote_old_sleep", outcome="timeout_best_effort"
    )
    operation_step_done(operation_id=failover.id, step="demote_old_train")

    html = staff_client.get("/fleets/demo/live/").content.decode()

    assert "data-bar-figure>4.0 s</text>" in html
    assert "data-after-switch><title>after the switch, on the old active: " in html
    assert "demote_old_sleep 17.0 s (timeout best effort)" in html
    assert ">+17.0 s</text>" in html
    assert 'class="s-demote_old_sleep"' not in html  # not drawn as part of the bar
