"""The Django front door (fleets.proxy.views) answers like the lean ASGI app."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from tests.proxy.conftest import CHAT, chat_body

pytestmark = pytest.mark.django_db(transaction=True)


FLEET = {"x-haru-fleet": "demo"}


@pytest.fixture
def django_client():
    return AsyncClient()


async def test_chat_through_django_reaches_the_model_server(django_client, engines, proxy_fleet):
    body = b'{"model": "qwen-small",  "odd":  [1 ,2]}'
    response = await django_client.post(CHAT, body, content_type="application/json", headers=FLEET)
    assert response.status_code == 200
    assert b"".join([chunk async for chunk in response.streaming_content]) == (
        b'{"engine": "east", "path": "/v1/chat/completions"}'
    )
    assert engines["east"].requests[0]["body"] == body


async def test_errors_through_django_use_the_envelope(django_client, engines, proxy_fleet):
    response = await django_client.post(
        CHAT, chat_body("nope"), content_type="application/json", headers=FLEET
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    refused = await django_client.get(CHAT)
    assert (refused.status_code, refused.json()["error"]["code"]) == (405, "method_not_allowed")


async def test_models_through_django(django_client, proxy_fleet, api_token):
    assert (await django_client.get("/v1/models", headers=FLEET)).status_code == 401
    response = await django_client.get(
        "/v1/models", headers={"authorization": f"Bearer {api_token}", **FLEET}
    )
    assert [m["id"] for m in response.json()["data"]] == ["llama-small", "qwen-small"]
