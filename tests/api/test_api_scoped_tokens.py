"""Scoped tokens on the REST API: a chat token (HARU_CHAT_TOKENS) is refused with 403 on every
REST route, the operator token (HARU_API_TOKEN) is served, and no token value is ever logged."""

from __future__ import annotations

import logging

import pytest
from django.core import checks

from fleets.checks import scoped_tokens
from fleets.models import Event, Operation

pytestmark = pytest.mark.django_db

OPERATOR = "operator-token-0123456789abcdefghijklmnopq"
CHAT = "chat-token-0123456789abcdefghijklmnopqrstu"
OTHER_CHAT = "chat-token-two-0123456789abcdefghijklmnop"

WRITES = [
    ("/v1/fleets/demo/promote", {"targetDomainId": "west"}),
    ("/v1/fleets/demo/demote", {"targetDomainId": "west"}),
    ("/v1/fleets/demo/reconcile", {}),
    ("/v1/fleets/demo/domains/west/provision", {}),
    ("/v1/fleets/demo/domains/west/stop", {}),
]
READS = ["/v1/fleets", "/v1/fleets/demo", "/v1/fleets/demo/route-intent", "/v1/openapi.json"]


@pytest.fixture
def scoped(settings):
    settings.HARU = {**settings.HARU, "api_token": OPERATOR, "chat_tokens": [CHAT, OTHER_CHAT]}


@pytest.mark.parametrize(("url", "body"), WRITES, ids=[u for u, _ in WRITES])
@pytest.mark.parametrize("token", [CHAT, OTHER_CHAT], ids=["first", "second"])
def test_a_chat_token_cannot_write(
    seeded_fleet, scoped, api_client, envelope, caplog, url, body, token
):
    events = Event.objects.count()
    with caplog.at_level(logging.DEBUG):
        response = api_client.post(url, body, format="json", HTTP_AUTHORIZATION=f"Bearer {token}")
    error = envelope(response, 403, "token_scope")
    assert "chat endpoints" in error["message"] and "HARU_API_TOKEN" in error["message"]
    assert token not in response.content.decode()
    assert Operation.objects.count() == 0 and Event.objects.count() == events
    assert CHAT not in caplog.text and OTHER_CHAT not in caplog.text and OPERATOR not in caplog.text


@pytest.mark.parametrize("url", READS)
def test_a_chat_token_cannot_read_the_fleet_either(seeded_fleet, scoped, api_client, envelope, url):
    response = api_client.get(url, HTTP_AUTHORIZATION=f"Bearer {CHAT}")
    envelope(response, 403, "token_scope")


def test_the_operator_token_is_served(seeded_fleet, scoped, api_client):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {OPERATOR}"}
    assert api_client.get("/v1/fleets/demo", **auth).status_code == 200
    response = api_client.post(
        "/v1/fleets/demo/promote", {"targetDomainId": "west"}, format="json", **auth
    )
    assert response.status_code == 202, response.content[:300]


def test_an_unknown_token_is_still_401(seeded_fleet, scoped, api_client, envelope):
    response = api_client.get("/v1/fleets", HTTP_AUTHORIZATION=f"Bearer {CHAT}x")
    envelope(response, 401, "unauthorized")


def test_chat_tokens_that_scope_nothing_stop_start_up(settings):
    settings.HARU = {**settings.HARU, "api_token": None, "chat_tokens": [CHAT]}
    (error,) = scoped_tokens()
    assert error.level == checks.ERROR and error.id == "haru.E001"
    settings.HARU = {**settings.HARU, "api_token": OPERATOR, "chat_tokens": [CHAT, OPERATOR]}
    (error,) = scoped_tokens()
    assert error.id == "haru.E002" and OPERATOR not in error.msg
    settings.HARU = {**settings.HARU, "api_token": OPERATOR, "chat_tokens": [CHAT]}
    assert scoped_tokens() == []
