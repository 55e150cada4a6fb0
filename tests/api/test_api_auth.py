"""Authentication: every /v1/ route needs the bearer token; /healthz needs nothing."""

from __future__ import annotations

import base64

import pytest
from django.urls import get_resolver
from rest_framework.test import APIClient

from fleets.api import urls as api_urls
from fleets.api.auth import HasApiToken
from fleets.core.access import Role
from fleets.services.access import fleet_role_set
from tests.conftest import API_TOKEN

pytestmark = pytest.mark.django_db

OP_ID = "3f1c2a6e-0000-4000-8000-000000000000"
ROLLOUT_ID = "5b2d3c7f-0000-4000-8000-000000000000"

# Every route of fleets.api.urls, with a request that would otherwise succeed (or 404).
ROUTES = [
    ("get", "/v1/fleets"),
    ("get", "/v1/fleets/demo"),
    ("get", "/v1/fleets/no-such-fleet"),  # existence is not disclosed before auth
    ("get", "/v1/fleets/demo/route-intent"),
    ("post", "/v1/fleets/demo/promote"),
    ("post", "/v1/fleets/demo/demote"),
    ("get", "/v1/fleets/demo/operations"),
    ("get", "/v1/fleets/demo/baselines"),
    ("get", "/v1/fleets/demo/recovery"),
    ("post", "/v1/fleets/demo/drill"),
    ("post", "/v1/fleets/demo/domains/west/provision"),
    ("post", "/v1/fleets/demo/domains/west/stop"),
    ("get", f"/v1/operations/{OP_ID}"),
    ("post", f"/v1/fleets/demo/operations/{OP_ID}/cancel"),
    ("get", "/v1/fleets/demo/rollouts"),
    ("post", "/v1/fleets/demo/rollouts"),
    ("get", f"/v1/fleets/demo/rollouts/{ROLLOUT_ID}"),
    ("post", f"/v1/fleets/demo/rollouts/{ROLLOUT_ID}/pause"),
    ("get", "/v1/fleets/demo/adapters"),
    ("get", "/v1/fleets/demo/adapters/support-bot"),
    ("post", "/v1/fleets/demo/adapters/support-bot/pin"),
    ("post", "/v1/fleets/demo/adapters/support-bot/unpin"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/docs"),
]
# The reconcile route arrives with the reconciler; guard it as soon as it exists. It is left out
# of the with-token run: a tick there would call the (absent) supervisors.
if any(str(p.pattern) == "fleets/<str:ref>/reconcile" for p in api_urls.urlpatterns):
    ROUTES.append(("post", "/v1/fleets/demo/reconcile"))

WRONG_HEADERS = {
    "wrong token": "Bearer not-the-token",
    "token with a suffix": f"Bearer {API_TOKEN}x",
    "token prefix only": f"Bearer {API_TOKEN[:10]}",
    "basic scheme": f"Basic {base64.b64encode(API_TOKEN.encode()).decode()}",
    "no scheme": API_TOKEN,
    "empty bearer": "Bearer ",
}


def call(client, method: str, url: str, **kwargs):
    if method == "post":
        body = {} if url.endswith("/reconcile") else {"targetDomainId": "west"}
        return client.post(url, body, format="json", **kwargs)
    return client.get(url, **kwargs)


def test_route_list_covers_every_api_route():
    patterns = {str(p.pattern) for p in api_urls.urlpatterns}
    covered = {
        url.removeprefix("/v1/")
        .replace("fleets/demo", "fleets/<str:ref>", 1)
        .replace(OP_ID, "<str:operation_id>")
        .replace(f"{ROLLOUT_ID}/pause", f"{ROLLOUT_ID}/<str:action>")
        .replace(ROLLOUT_ID, "<str:rollout_id>")
        .replace("domains/west", "domains/<str:domain>")
        .replace("adapters/support-bot", "adapters/<str:name>")
        for _m, url in ROUTES
    }
    assert patterns <= covered


@pytest.mark.parametrize(("method", "url"), ROUTES)
def test_route_without_a_token_is_401(seeded_fleet, api_client, api_token, envelope, method, url):
    response = call(api_client, method, url)
    error = envelope(response, 401, "unauthorized")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert api_token not in error["message"]


@pytest.mark.parametrize(("method", "url"), ROUTES)
@pytest.mark.parametrize("header", WRONG_HEADERS.values(), ids=WRONG_HEADERS.keys())
def test_route_with_a_wrong_token_is_401(
    seeded_fleet, api_client, api_token, envelope, method, url, header
):
    response = call(api_client, method, url, HTTP_AUTHORIZATION=header)
    error = envelope(response, 401, "unauthorized")
    assert api_token not in error["message"]


# Provision and stop refuse the demo's static domains (409); tests/api/test_api_provisioning.py.
# A drill needs a standby with a fresh heartbeat (422 here); tests/api/test_api_drills.py.
# A rollout's body is not a target's (400 here); tests/api/test_api_rollouts.py.
# Neither is a pin's (400 here); tests/api/test_api_adapters.py.
@pytest.mark.parametrize(
    ("method", "url"),
    [
        r
        for r in ROUTES
        if "reconcile" not in r[1]
        and "/domains/" not in r[1]
        and "/drill" not in r[1]
        and r != ("post", "/v1/fleets/demo/rollouts")
        and not r[1].endswith("/pin")
    ],
)
def test_route_with_the_token_is_served(seeded_fleet, client_with_token, method, url):
    response = call(client_with_token, method, url)
    assert response.status_code in {200, 202, 404}, response.content[:300]
    if "no-such" in url or OP_ID in url or ROLLOUT_ID in url:
        assert response.status_code == 404


def test_bearer_scheme_is_case_insensitive(seeded_fleet, api_client, api_token):
    response = api_client.get("/v1/fleets", HTTP_AUTHORIZATION=f"bearer {api_token}")
    assert response.status_code == 200


@pytest.mark.parametrize("separator", ["\t", "  ", " \t"])
def test_a_tab_or_more_blanks_before_the_token_are_accepted_as_by_the_supervisor(
    seeded_fleet, api_client, api_token, separator
):
    # One parse for every gate (common/bearer.py); docs/wire.md says why tabs are accepted.
    header = f"Bearer{separator}{api_token}\t"
    assert api_client.get("/v1/fleets", HTTP_AUTHORIZATION=header).status_code == 200
    extra = f"Bearer {api_token} extra"
    assert api_client.get("/v1/fleets", HTTP_AUTHORIZATION=extra).status_code == 401


def test_without_a_configured_token_the_api_is_open(seeded_fleet, api_client, settings):
    settings.HARU = {**settings.HARU, "api_token": None}
    assert api_client.get("/v1/fleets").status_code == 200
    # A stray header is ignored rather than refused: nothing to compare it with.
    assert api_client.get("/v1/fleets", HTTP_AUTHORIZATION="Bearer x").status_code == 200


def test_a_session_is_accepted_only_for_a_user_with_a_fleet_role(
    seeded_fleet, api_client, api_token, django_user_model, envelope
):
    user = django_user_model.objects.create_user("viewer", password="pw-123456")
    api_client.force_login(user)
    envelope(api_client.get("/v1/fleets"), 401, "unauthorized")
    # Staff status lets a user into the Django admin; it grants no fleet (docs/access.md).
    user.is_staff = True
    user.save()
    api_client.force_login(user)
    envelope(api_client.get("/v1/fleets"), 401, "unauthorized")
    fleet_role_set(holder=user, role=Role.VIEW, fleet=seeded_fleet)
    api_client.force_login(django_user_model.objects.get(pk=user.pk))
    assert api_client.get("/v1/fleets").status_code == 200


def test_a_session_needs_csrf_to_write(seeded_fleet, api_token, django_user_model, envelope):
    admin = django_user_model.objects.create_superuser("ops", password="pw-123456")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(admin)
    response = client.post("/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json")
    envelope(response, 403, "forbidden")
    assert "CSRF" in response.json()["error"]["message"]


def test_healthz_needs_no_token_and_never_touches_the_database(
    api_client, api_token, django_assert_num_queries
):
    with django_assert_num_queries(0):
        response = api_client.get("/healthz")
        wrong = api_client.get("/healthz", HTTP_AUTHORIZATION="Bearer wrong")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert wrong.status_code == 200


def test_unknown_v1_route_is_a_404_envelope(client_with_token, envelope):
    envelope(client_with_token.get("/v1/nothing-here"), 404, "not_found")
    envelope(client_with_token.get("/v1/fleets/demo/nothing-here"), 404, "not_found")


def test_every_v1_route_is_a_drf_view_with_the_token_permission():
    """A new /v1/ route added without the token check would be an open door."""

    resolver = get_resolver()
    for pattern in resolver.url_patterns:
        if str(pattern.pattern) != "v1/":
            continue
        for route in pattern.url_patterns:
            view_class = getattr(route.callback, "cls", None)
            if view_class is None:
                continue  # plain Django views (e.g. the chat proxy) check the token themselves
            guarded = any(issubclass(p, HasApiToken) for p in view_class.permission_classes)
            assert guarded, route.pattern
