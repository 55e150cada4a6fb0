"""Per-fleet access on the REST API: a stored token scoped to one fleet gets 403 on every other
fleet's endpoints (every route of fleets/api/urls.py that names a fleet, enumerated from the
URL patterns, so a new endpoint cannot be left out), a read token gets 403 on every write, and
each refusal is an `access.denied` event of the fleet it concerned, bounded under a flood."""

from __future__ import annotations

import io
import logging
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY

from fleets.api import urls as api_urls
from fleets.api.auth import FleetRole
from fleets.core.access import TokenScope
from fleets.models import AdapterVersion, ApiToken, Domain, Event, Fleet, Operation, Rollout
from fleets.services.access import api_token_create
from fleets.services.operations import operation_request
from tests.access_fixtures import denials

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("denials_forgotten")]

MISSING_OP = "3f1c2a6e-0000-4000-8000-000000000000"


def fleet_routes() -> list[tuple[str, str, str]]:
    """(method, route pattern, url name) of every API route that names a fleet (directly, or
    through an operation), for every method its view answers."""
    out = []
    for pattern in api_urls.urlpatterns:
        route = str(pattern.pattern)
        if "<str:ref>" not in route and "<str:operation_id>" not in route:
            continue
        view = pattern.callback.cls
        for method in ("get", "post", "put", "patch", "delete"):
            if hasattr(view, method):
                out.append((method, route, pattern.name))
    return out


ROUTES = fleet_routes()
IDS = [f"{method} {route}" for method, route, _name in ROUTES]


def concrete(route: str, *, fleet: str, operation_id: str, rollout_id: str = MISSING_OP) -> str:
    """The URL of `route` on `fleet` (an operation and a rollout of that fleet, its domain
    `west`; a rollout's action: pause)."""
    values = {
        "ref": fleet,
        "operation_id": operation_id,
        "domain": "west",
        "rollout_id": rollout_id,
        "action": "pause",
        "name": "support-bot",
    }
    return "/v1/" + re.sub(r"<str:(\w+)>", lambda m: values[m.group(1)], route)


def call(client, method: str, url: str, token: str):
    body = {"targetDomainId": "west"} if url.endswith(("/promote", "/demote")) else {}
    return getattr(client, method)(url, body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.fixture
def other_op(other_fleet) -> Operation:
    west = Domain.objects.get(fleet=other_fleet, slug="west")
    return operation_request(fleet=other_fleet, kind="promote", target_domain_id=west.id).operation


def token_for(scope: TokenScope, *fleets: Fleet, name: str = "scoped") -> str:
    return api_token_create(name=name, scope=scope, fleets=list(fleets))[1]


def test_the_enumeration_finds_every_fleet_route_and_each_is_guarded():
    # The enumeration is not empty by accident, and every route it finds has the role check.
    names = {name for _m, _r, name in ROUTES}
    assert {"fleet-detail", "fleet-promote", "operation-cancel", "operation-detail"} <= names
    assert {"domain-provision", "domain-stop", "fleet-reconcile", "fleet-baselines"} <= names
    for pattern in api_urls.urlpatterns:
        if pattern.name in names:
            checks = pattern.callback.cls().get_permissions()
            assert any(isinstance(p, FleetRole) for p in checks), pattern.name


@pytest.mark.parametrize("scope", list(TokenScope))
@pytest.mark.parametrize(
    ("method", "route", "name"), ROUTES, ids=[f"{m} {r}" for m, r, _ in ROUTES]
)
def test_a_token_scoped_to_one_fleet_gets_403_on_every_other_fleets_endpoint(
    seeded_fleet, other_fleet, other_op, api_client, api_token, envelope, scope, method, route, name
):
    token = token_for(scope, seeded_fleet)
    operations = Operation.objects.count()
    url = concrete(route, fleet=other_fleet.slug, operation_id=str(other_op.id))

    response = call(api_client, method, url, token)

    error = envelope(response, 403, "forbidden")
    assert token not in error["message"]
    assert Operation.objects.count() == operations  # nothing moved
    (event,) = denials(other_fleet)
    assert event.actor.startswith("api:token:scoped")
    assert event.data["surface"] == "api" and event.data["held"] == "none"
    assert event.data["action"] == f"{method.upper()} {name}"
    assert token not in str(event.data) and token not in event.actor
    assert denials(seeded_fleet) == []


@pytest.mark.parametrize(
    ("method", "route", "name"), ROUTES, ids=[f"{m} {r}" for m, r, _ in ROUTES]
)
def test_a_missing_fleet_is_403_too_so_a_scoped_token_cannot_map_the_others(
    seeded_fleet, api_client, api_token, envelope, method, route, name
):
    token = token_for(TokenScope.OPERATE, seeded_fleet)
    url = concrete(route, fleet="no-such-fleet", operation_id=MISSING_OP)
    envelope(call(api_client, method, url, token), 403, "forbidden")


def test_an_all_fleet_token_still_gets_404_for_a_missing_fleet(api_client, api_token, envelope):
    token = api_token_create(name="all", scope=TokenScope.READ, fleets=None)[1]
    envelope(call(api_client, "get", "/v1/fleets/no-such-fleet", token), 404, "fleet_not_found")


def test_a_read_token_reads_its_fleet_and_gets_403_on_every_write(
    seeded_fleet, api_client, api_token, envelope
):
    token = token_for(TokenScope.READ, seeded_fleet)
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    own = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    now = timezone.now()
    rollout = Rollout.objects.create(
        fleet=seeded_fleet, model="qwen-small", state="rolled_back", created_at=now, updated_at=now
    )
    AdapterVersion.objects.create(
        fleet=seeded_fleet,
        name="support-bot",
        version=1,
        base_model="qwen-small",
        digest="sha256:" + "0" * 64,
        size_bytes=1,
        manifest={},
        completed_at=now,
        registered_at=now,
    )
    for method, route, _name in ROUTES:
        url = concrete(
            route, fleet=seeded_fleet.slug, operation_id=str(own.id), rollout_id=str(rollout.id)
        )
        response = call(api_client, method, url, token)
        if method == "get":
            assert response.status_code == 200, (url, response.content[:200])
        else:
            envelope(response, 403, "forbidden")
    writes = {name for method, _r, name in ROUTES if method != "get"}
    recorded = {e.data["action"].split()[1] for e in denials(seeded_fleet)}
    assert recorded == writes
    assert {e.data["needed"] for e in denials(seeded_fleet)} == {"operate"}
    assert Operation.objects.count() == 1


def test_an_operate_token_moves_its_own_fleet(seeded_fleet, api_client, api_token):
    token = token_for(TokenScope.OPERATE, seeded_fleet)
    response = call(api_client, "post", "/v1/fleets/demo/promote", token)
    assert response.status_code == 202, response.content[:300]
    assert response.json()["operation"]["requestedBy"] == "api:token:scoped"


def test_a_scoped_token_lists_only_its_fleets(seeded_fleet, other_fleet, api_client, api_token):
    token = token_for(TokenScope.READ, other_fleet)
    body = call(api_client, "get", "/v1/fleets", token).json()
    assert [f["slug"] for f in body["fleets"]] == ["other"]
    everything = call(api_client, "get", "/v1/fleets", api_token).json()
    assert [f["slug"] for f in everything["fleets"]] == ["demo", "other"]


def test_a_revoked_or_unknown_stored_token_is_401(seeded_fleet, api_client, api_token, envelope):
    token = token_for(TokenScope.READ, seeded_fleet, name="gone")
    assert call(api_client, "get", "/v1/fleets/demo", token).status_code == 200
    call_command("api_token", "revoke", "gone", stdout=io.StringIO())
    envelope(call(api_client, "get", "/v1/fleets/demo", token), 401, "unauthorized")
    envelope(call(api_client, "get", "/v1/fleets/demo", token[:-1] + "x"), 401, "unauthorized")


def test_only_the_digest_is_kept_and_use_is_recorded(seeded_fleet, api_client, api_token):
    token = token_for(TokenScope.READ, seeded_fleet)
    row = ApiToken.objects.get()
    assert token not in {row.secret_sha256, row.prefix} and token.startswith(row.prefix)
    assert row.last_used_at is None
    call(api_client, "get", "/v1/fleets/demo", token)
    row.refresh_from_db()
    assert row.last_used_at is not None


def _denied_total(surface: str) -> float:
    return REGISTRY.get_sample_value("haru_access_denied_total", {"surface": surface}) or 0.0


def test_a_hammering_client_adds_one_event_a_window_and_every_refusal_is_counted(
    seeded_fleet, other_fleet, api_client, api_token
):
    token = token_for(TokenScope.OPERATE, seeded_fleet)
    before = _denied_total("api")
    for _ in range(30):
        assert call(api_client, "post", "/v1/fleets/other/promote", token).status_code == 403
    assert _denied_total("api") - before == 30
    (event,) = denials(other_fleet)
    assert event.data["suppressed"] == 0
    # Another action is its own key: recorded at once, not folded into the promote's window.
    call(api_client, "post", "/v1/fleets/other/drill", token)
    assert len(denials(other_fleet)) == 2


def test_the_folded_refusals_are_reported_by_the_next_windows_event(
    seeded_fleet, other_fleet, api_client, api_token
):
    from django.core.cache import cache  # noqa: PLC0415 - the window is the cache's

    token = token_for(TokenScope.OPERATE, seeded_fleet)
    for _ in range(5):
        call(api_client, "post", "/v1/fleets/other/promote", token)
    # The window ends (its marker expires); the suppressed count outlives it.
    markers = [k.split(":", 2)[2] for k in list(cache._cache) if ":haru:denied:w:" in k]
    assert markers  # the tests' local-memory cache keys `:<version>:<key>`
    cache.delete_many(markers)
    call(api_client, "post", "/v1/fleets/other/promote", token)
    first, second = denials(other_fleet)
    assert (first.data["suppressed"], second.data["suppressed"]) == (0, 4)


def test_the_operator_token_and_superusers_reach_every_fleet(
    seeded_fleet, other_fleet, api_client, api_token, django_user_model
):
    assert call(api_client, "get", "/v1/fleets/other", api_token).status_code == 200
    admin = django_user_model.objects.create_superuser("root", password="pw-0123456789")
    api_client.force_login(admin)
    assert api_client.get("/v1/fleets/other").status_code == 200
    assert Event.objects.filter(kind="access.denied").count() == 0


def test_use_is_written_at_most_once_a_minute(seeded_fleet, api_client, api_token):
    token = token_for(TokenScope.READ, seeded_fleet)
    call(api_client, "get", "/v1/fleets/demo", token)
    first = ApiToken.objects.get().last_used_at
    call(api_client, "get", "/v1/fleets/demo", token)
    assert ApiToken.objects.get().last_used_at == first
    ApiToken.objects.update(last_used_at=first - timedelta(minutes=2))
    call(api_client, "get", "/v1/fleets/demo", token)
    assert ApiToken.objects.get().last_used_at > first - timedelta(minutes=2)


def test_a_chat_token_hammering_the_rest_api_is_one_log_line_a_window(
    seeded_fleet, api_client, settings, caplog
):
    chat = "chat-token-0123456789abcdefghijklmnopqrstu"
    operator = "operator-token-0123456789abcdefghijklmnopq"
    settings.HARU = {**settings.HARU, "api_token": operator, "chat_tokens": [chat]}
    with caplog.at_level(logging.WARNING, logger="fleets.services.access"):
        for n in range(20):
            response = call(api_client, "get", f"/v1/fleets/probe-{n}", chat)
            assert response.status_code == 403
    lines = [r for r in caplog.records if r.name == "fleets.services.access"]
    assert len(lines) == 1 and chat not in caplog.text
