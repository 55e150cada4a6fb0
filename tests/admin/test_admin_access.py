"""Per-fleet access in the admin: its state-moving actions run only on rows whose fleet the
user may operate (a staff account that may only view is refused, audited); a fleet's Access
page grants a role on that fleet; a token created in the admin shows its secret once."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from fleets.core.access import Role
from fleets.models import ApiToken, Domain, Fleet, Operation
from fleets.reads.access import secret_digest, user_grant
from fleets.services.access import fleet_role_set
from tests.access_fixtures import denials
from tests.admin.test_admin_layouts import _action

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("denials_forgotten")]


@pytest.fixture
def viewing_staff(django_user_model) -> Client:
    """A staff account with the admin's model permissions to see fleets and domains only."""
    user = django_user_model.objects.create_user("clerk", password="pw-0123456789", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_fleet", "view_domain", "view_operation"])
    )
    client = Client()
    client.force_login(user)
    return client


def test_a_viewer_cannot_move_a_fleet_from_the_admin(viewing_staff, seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    done = _action(viewing_staff, "domain", "promote_domain", [west.pk], confirm=True)
    assert "refused, you need the operate role" in done.content.decode()
    assert not Operation.objects.exists()
    (event,) = denials(seeded_fleet)
    assert (event.actor, event.data["surface"]) == ("admin:clerk", "admin")

    _action(viewing_staff, "fleet", "reconcile_now", [seeded_fleet.pk], confirm=True)
    assert [e.data["action"] for e in denials(seeded_fleet)] == ["promote_domain", "reconcile_now"]


def test_the_fleet_access_page_grants_a_role_on_that_fleet(
    superuser_client, seeded_fleet, other_fleet, django_user_model
):
    user = django_user_model.objects.create_user("alice", password="pw-0123456789")
    change = superuser_client.get(f"/admin/fleets/fleet/{seeded_fleet.pk}/change/")
    assert f"/admin/fleets/fleet/{seeded_fleet.pk}/permissions/" in change.content.decode()
    page = f"/admin/fleets/fleet/{seeded_fleet.pk}/permissions/user-manage/{user.pk}/"
    response = superuser_client.post(page, {"permissions": ["operate_fleet"]})
    assert response.status_code == 302, response.content[:500]
    grant = user_grant(django_user_model.objects.get(pk=user.pk))
    assert grant.role(seeded_fleet.pk) == Role.OPERATE
    assert grant.role(other_fleet.pk) == Role.NONE


def test_a_token_created_in_the_admin_shows_its_secret_once(superuser_client, seeded_fleet):
    response = superuser_client.post(
        "/admin/fleets/apitoken/add/",
        {"name": "ci-reader", "scope": "read", "fleets": [str(seeded_fleet.pk)]},
    )
    assert response.status_code == 200, response.content[:500]
    secret = re.search(r"data-token-secret[^>]*>([^<]+)<", response.content.decode())[1]
    token = ApiToken.objects.get(name="ci-reader")
    assert token.secret_sha256 == secret_digest(secret)
    assert list(token.fleets.values_list("slug", flat=True)) == ["demo"]
    listing = superuser_client.get("/admin/fleets/apitoken/").content.decode()
    assert secret not in listing and token.prefix in listing


def test_layout_edits_and_access_need_the_administer_role_on_that_fleet(
    seeded_fleet, other_fleet, django_user_model
):
    # change_fleet lets a staff user use the edit pages; the role says on which fleets.
    user = django_user_model.objects.create_user("lead", password="pw-0123456789", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_fleet", "change_fleet", "delete_fleet"])
    )
    fleet_role_set(holder=user, role=Role.ADMINISTER, fleet=seeded_fleet)
    client = Client()
    client.force_login(user)

    own = client.get(f"/admin/fleets/fleet/{seeded_fleet.pk}/change/").content.decode()
    theirs = client.get(f"/admin/fleets/fleet/{other_fleet.pk}/change/").content.decode()
    assert 'name="_save"' in own and 'name="_save"' not in theirs
    assert client.get(f"/admin/fleets/fleet/{seeded_fleet.pk}/permissions/").status_code == 200
    assert client.get(f"/admin/fleets/fleet/{other_fleet.pk}/permissions/").status_code == 403
    (event,) = denials(other_fleet)
    assert (event.data["action"], event.data["needed"]) == ("manage access", "administer")

    client.post(f"/admin/fleets/fleet/{other_fleet.pk}/delete/", {"post": "yes"})
    assert Fleet.objects.filter(pk=other_fleet.pk).exists()
