"""Only the lean ASGI app serves the chat proxy; the benchmark's Django-view baseline
(bench/django_proxy.py, not shipped) still answers like it, so the comparison stays fair."""

from __future__ import annotations

import pytest
from django.test import AsyncClient

from tests.proxy.conftest import CHAT, chat_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("bench.django_proxy")]


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


@pytest.mark.urls("haru.urls")
@pytest.mark.parametrize(("method", "path"), [("post", CHAT), ("post", "/v1/completions")])
async def test_django_itself_no_longer_serves_the_chat_proxy(django_client, method, path):
    # The Django-view fallback is gone: a request that reaches Django (its test client, or a
    # deployment without haru/asgi.py) gets the JSON 404, never a half-featured proxy.
    response = await getattr(django_client, method)(
        path, b"{}", content_type="application/json", headers=FLEET
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
