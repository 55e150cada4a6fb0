"""Drill schedules and actions in admin: validated, confirmed, through the same services."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.models import Domain, Fleet, Operation
from tests.admin.test_admin_layouts import _action, _change_url, _get_form

pytestmark = pytest.mark.django_db


def test_the_drill_schedule_is_set_in_the_fleet_form(superuser_client, admin_form, seeded_fleet):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    data.update(drill_interval_minutes="30", drill_window_start="02:00", drill_window_end="04:00")
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 302, response.context and response.context["errors"]
    fleet = Fleet.objects.get(pk=seeded_fleet.pk)
    assert fleet.drill_interval_minutes == 30
    assert (str(fleet.drill_window_start), str(fleet.drill_window_end)) == ("02:00:00", "04:00:00")


def test_a_half_window_is_refused_with_nothing_saved(superuser_client, admin_form, seeded_fleet):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    data.update(drill_interval_minutes="30", drill_window_start="02:00", drill_window_end="")
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    assert "give both ends of the drill window" in response.content.decode()
    assert Fleet.objects.get(pk=seeded_fleet.pk).drill_interval_minutes is None


def test_run_drill_confirms_then_requests_a_drill(superuser_client, seeded_fleet):
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    page = _action(superuser_client, "fleet", "run_drill", [seeded_fleet.pk], confirm=False)
    assert page.status_code == 200 and not Operation.objects.exists()

    done = _action(superuser_client, "fleet", "run_drill", [seeded_fleet.pk], confirm=True)
    op = Operation.objects.get()
    assert (op.kind, op.target_slug, op.requested_by) == ("drill", "west", "admin:root")
    assert "drill of west started" in done.content.decode()


def test_the_drill_mode_is_chosen_in_the_fleet_form(superuser_client, admin_form, seeded_fleet):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    assert data["drill_mode"] == "check"
    data.update(drill_mode="round_trip")
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 302, response.context and response.context["errors"]
    assert Fleet.objects.get(pk=seeded_fleet.pk).drill_mode == "round_trip"
    data.update(drill_mode="sideways")
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    assert Fleet.objects.get(pk=seeded_fleet.pk).drill_mode == "round_trip"


def test_run_drill_runs_the_fleets_mode_and_says_why_a_round_trip_is_refused(
    superuser_client, seeded_fleet
):
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    Fleet.objects.filter(pk=seeded_fleet.pk).update(
        drill_mode="round_trip", policy={"autoFailover": False}
    )
    refused = _action(superuser_client, "fleet", "run_drill", [seeded_fleet.pk], confirm=True)
    assert "autoFailover is off" in refused.content.decode()
    assert not Operation.objects.exists()

    Fleet.objects.filter(pk=seeded_fleet.pk).update(policy={"autoFailover": True})
    done = _action(superuser_client, "fleet", "run_drill", [seeded_fleet.pk], confirm=True)
    op = Operation.objects.get()
    assert (op.kind, op.drill_mode) == ("drill", "round_trip")
    assert "round_trip drill of west started" in done.content.decode()
