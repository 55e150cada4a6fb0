"""The management commands of per-fleet access: `api_token` (create, list, revoke) and
`fleet_access` (grant a role to a user or a group, show a user's roles)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from fleets.core.access import Role
from fleets.models import ApiToken
from fleets.reads.access import secret_digest, user_grant
from fleets.services.fleets import fleet_delete

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_prints_only_the_secret_and_keeps_its_digest(seeded_fleet, api_client, api_token):
    secret = run("api_token", "create", "ci-reader", "--scope", "read", "--fleet", "demo").strip()
    token = ApiToken.objects.get()
    assert token.secret_sha256 == secret_digest(secret) and len(secret) >= 40
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert api_client.get("/v1/fleets/demo", **auth).status_code == 200
    listing = run("api_token", "list")
    assert "ci-reader" in listing and "read" in listing and secret not in listing
    assert run("api_token", "revoke", "ci-reader").strip() == "revoked ci-reader"
    assert api_client.get("/v1/fleets/demo", **auth).status_code == 401
    assert "revoked" in run("api_token", "list")


def test_create_refuses_an_unknown_fleet_and_a_taken_name(seeded_fleet):
    with pytest.raises(CommandError, match="no fleet nope"):
        run("api_token", "create", "x", "--scope", "read", "--fleet", "nope")
    run("api_token", "create", "x", "--scope", "operate", "--all-fleets")
    with pytest.raises(CommandError, match="exists already"):
        run("api_token", "create", "x", "--scope", "read", "--all-fleets")


def test_grant_sets_a_role_per_fleet_or_for_every_fleet(seeded_fleet, django_user_model):
    user = django_user_model.objects.create_user("bob", password="pw-0123456789")
    run("fleet_access", "grant", "bob", "operate", "--fleet", "demo")
    assert user_grant(django_user_model.objects.get(pk=user.pk)).role(seeded_fleet.pk) == (
        Role.OPERATE
    )
    assert run("fleet_access", "show", "bob").strip() == "demo\toperate"
    run("fleet_access", "grant", "bob", "none", "--fleet", "demo")
    assert run("fleet_access", "show", "bob").strip() == "demo\tnone"

    group = Group.objects.create(name="viewers")
    user.groups.add(group)
    run("fleet_access", "grant", "--group", "viewers", "view")
    assert run("fleet_access", "show", "bob").strip() == "demo\tview"
    with pytest.raises(CommandError, match="no user"):
        run("fleet_access", "grant", "nobody", "view")


def test_deleting_a_fleet_forgets_its_grants(seeded_fleet, django_user_model):
    user = django_user_model.objects.create_user("carol", password="pw-0123456789")
    run("fleet_access", "grant", "carol", "view", "--fleet", "demo")
    assert user_grant(django_user_model.objects.get(pk=user.pk)).is_member
    fleet_delete(fleet_id=seeded_fleet.pk, actor="test")
    # Guardian's rows name the fleet generically: nothing else would have removed them.
    assert not user_grant(django_user_model.objects.get(pk=user.pk)).is_member
