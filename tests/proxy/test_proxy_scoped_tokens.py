"""Scoped tokens on the chat proxy: a chat token and the operator token both reach the chat
endpoints; anything else is 401 and never reaches a model server."""

from __future__ import annotations

import pytest

from tests.proxy.conftest import CHAT, chat_body, error_of

pytestmark = pytest.mark.django_db(transaction=True)

OPERATOR = "operator-token-0123456789abcdefghijklmnopq"
CHAT_TOKEN = "chat-token-0123456789abcdefghijklmnopqrstu"


@pytest.fixture
def scoped(settings):
    settings.HARU = {**settings.HARU, "api_token": OPERATOR, "chat_tokens": [CHAT_TOKEN]}


@pytest.mark.parametrize("token", [CHAT_TOKEN, OPERATOR], ids=["chat", "operator"])
async def test_chat_and_operator_tokens_reach_every_chat_endpoint(
    haru, engines, proxy_fleet, scoped, token
):
    auth = {"authorization": f"Bearer {token}"}
    assert (await haru.post(CHAT, content=chat_body(), headers=auth)).status_code == 200
    completion = await haru.post("/v1/completions", content=chat_body(prompt="x"), headers=auth)
    assert completion.status_code == 200
    assert (await haru.get("/v1/models", headers=auth)).status_code == 200
    # The client's token is never forwarded to the model server.
    assert all(b"authorization" not in r["headers"] for r in engines["east"].requests)


async def test_other_tokens_are_refused(haru, engines, proxy_fleet, scoped):
    for header in ({}, {"authorization": f"Bearer {CHAT_TOKEN}x"}, {"authorization": "Bearer x"}):
        response = await haru.post(CHAT, content=chat_body(), headers=header)
        assert error_of(response) == (401, "unauthorized")
    assert engines["east"].requests == []


async def test_chat_tokens_alone_still_guard_chat(haru, engines, proxy_fleet, settings):
    settings.HARU = {**settings.HARU, "api_token": None, "chat_tokens": [CHAT_TOKEN]}
    assert error_of(await haru.post(CHAT, content=chat_body())) == (401, "unauthorized")
    auth = {"authorization": f"Bearer {CHAT_TOKEN}"}
    assert (await haru.post(CHAT, content=chat_body(), headers=auth)).status_code == 200
