"""Per-fleet access in the portal: a view-only user sees a fleet's pages without one action
button and gets 403 (audited as `access.denied`) on every action, lists show only the fleets a
user may view, and staff status alone grants nothing (issue 29's lower finding)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from fleets.core.access import DASHBOARD_ACTION_ROLES, Role
from fleets.dashboard.forms import ACTIONS
from fleets.models import Domain, Event, GoldenBaseline, Operation
from fleets.services.access import fleet_role_set
from fleets.services.operations import operation_request
from tests.access_fixtures import denials

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("denials_forgotten")]


def login(django_user_model, name: str, **flags) -> tuple[Client, object]:
    user = django_user_model.objects.create_user(name, password="pw-0123456789", **flags)
    client = Client()
    client.force_login(user)
    return client, user


@pytest.fixture
def in_flight(seeded_fleet) -> Operation:
    """A promotion in flight on demo: the page then shows its cancel button too."""
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    return operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation


@pytest.fixture
def viewer(django_user_model, seeded_fleet) -> Client:
    client, user = login(django_user_model, "watcher", is_staff=True)
    fleet_role_set(holder=user, role=Role.VIEW, fleet=seeded_fleet)
    return client


@pytest.fixture
def operator(django_user_model, seeded_fleet) -> Client:
    client, user = login(django_user_model, "hands")
    fleet_role_set(holder=user, role=Role.OPERATE, fleet=seeded_fleet)
    return client


# Every button the page can show for this fleet in this state (in flight: cancel included).
BUTTONS = ("reconcile", "promote", "demote", "cancel", "drill", "baseline")


@pytest.mark.parametrize("page", ["/fleets/demo/", "/fleets/demo/live/"])
def test_a_view_only_user_sees_the_fleet_without_a_single_action_button(
    viewer, operator, in_flight, page
):
    html = operator.get(page).content.decode()
    for action in BUTTONS:  # the same state does show every button to an operator
        assert f"/fleets/demo/actions/{action}/" in html, action

    response = viewer.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    assert "/actions/" not in html and "data-action=" not in html
    assert "data-view-only" in html
    assert 'data-domain-slug="west"' in html  # the fleet itself is shown


def test_every_portal_action_has_a_role():
    assert set(DASHBOARD_ACTION_ROLES) == set(ACTIONS)


def _form(action: str, op: Operation) -> dict:
    target = str(op.id) if action == "cancel" else "west"
    return {"target": target, "confirm": "on", "mode": "check"}


@pytest.mark.parametrize("as_json", [False, True], ids=["page", "script"])
@pytest.mark.parametrize("action", ACTIONS)
def test_a_view_only_user_gets_403_on_every_action_and_it_is_audited(
    viewer, seeded_fleet, in_flight, action, as_json
):
    operations = list(Operation.objects.values_list("id", "state"))
    headers = {"HTTP_ACCEPT": "application/json"} if as_json else {}

    response = viewer.post(f"/fleets/demo/actions/{action}/", _form(action, in_flight), **headers)

    assert response.status_code == 403
    if as_json:
        assert response.json()["error"]["code"] == "forbidden"
    else:
        assert b"you need the operate role" in response.content
    assert list(Operation.objects.values_list("id", "state")) == operations
    assert not GoldenBaseline.objects.filter(reason="manual").exists()
    (event,) = denials(seeded_fleet)
    assert event.actor == "dashboard:watcher"
    assert event.data == {
        "surface": "dashboard",
        "action": action,
        "needed": "operate",
        "held": "view",
        "suppressed": 0,
    }


def test_an_unconfirmed_action_is_refused_before_its_confirmation_page(viewer, seeded_fleet):
    response = viewer.post("/fleets/demo/actions/promote/", {"target": "west"})
    assert response.status_code == 403
    assert b"Confirm:" not in response.content


def test_an_operator_of_one_fleet_acts_there_and_nowhere_else(operator, other_fleet):
    done = operator.post("/fleets/demo/actions/promote/", {"target": "west", "confirm": "on"})
    assert done.status_code == 302
    assert Operation.objects.filter(fleet__slug="demo").count() == 1
    refused = operator.post("/fleets/other/actions/promote/", {"target": "west", "confirm": "on"})
    assert refused.status_code == 403
    assert not Operation.objects.filter(fleet=other_fleet).exists()
    assert [e.data["held"] for e in denials(other_fleet)] == ["none"]


def test_staff_status_alone_grants_no_fleet(django_user_model, seeded_fleet):
    staff, _user = login(django_user_model, "staffer", is_staff=True)
    assert staff.get("/fleets/demo/").status_code == 403
    response = staff.post("/fleets/demo/actions/promote/", {"target": "west", "confirm": "on"})
    assert response.status_code == 403
    assert not Operation.objects.exists()


def test_a_global_role_through_a_group_covers_every_fleet(django_user_model, other_fleet):
    client, user = login(django_user_model, "oncall")
    group = Group.objects.create(name="oncall")
    fleet_role_set(holder=group, role=Role.OPERATE)
    user.groups.add(group)
    response = client.post("/fleets/other/actions/promote/", {"target": "west", "confirm": "on"})
    assert response.status_code == 302
    assert Operation.objects.filter(fleet=other_fleet).count() == 1


def test_lists_and_polls_show_only_the_fleets_a_user_may_view(viewer, seeded_fleet, other_fleet):
    for page in ("/", "/live/overview/"):
        html = viewer.get(page).content.decode()
        assert 'data-fleet-slug="demo"' in html and 'data-fleet-slug="other"' not in html
    domains = viewer.get("/live/heartbeats/").json()["domains"]
    assert set(domains) == {str(d.id) for d in Domain.objects.filter(fleet=seeded_fleet)}
    refused = viewer.get("/live/heartbeats/?fleet=other")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert viewer.get("/fleets/other/").status_code == 403
    # A missing fleet reads as a refusal to a user who may not see every fleet.
    assert viewer.get("/fleets/no-such-fleet/").status_code == 403
    # The page's refusal is the poll's action ("view") in the same window: one event for both.
    (event,) = denials(other_fleet)
    assert (event.actor, event.data["action"]) == ("dashboard:watcher", "view")


def test_a_superuser_still_sees_and_moves_everything(django_user_model, other_fleet):
    admin = Client()
    admin.force_login(django_user_model.objects.create_superuser("root", password="pw-0123456789"))
    html = admin.get("/").content.decode()
    assert 'data-fleet-slug="demo"' in html and 'data-fleet-slug="other"' in html
    assert admin.get("/fleets/no-such-fleet/").status_code == 404
    response = admin.post("/fleets/other/actions/promote/", {"target": "west", "confirm": "on"})
    assert response.status_code == 302
    assert not Event.objects.filter(kind="access.denied").exists()
