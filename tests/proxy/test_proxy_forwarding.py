"""Forwarding: bytes in, bytes out, streamed as they come; headers filtered both ways."""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.conftest import CHAT, chat_body

pytestmark = pytest.mark.django_db(transaction=True)


async def test_body_reaches_the_model_server_byte_for_byte(haru, engines, proxy_fleet):
    body = (
        b'{ "model" :  "qwen-small",\n\t"messages":[{"role":"user",'
        b'"content":"h\\u00e9llo \xe2\x9c\x93"}],'
        b'  "vendor_ext": {"x": [1,2 ,3], "nested": {"deep": null}} ,"top_k":40 }  \n'
    )
    response = await haru.post(
        CHAT, content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 200
    assert response.json() == {"engine": "east", "path": CHAT}
    [seen] = engines["east"].requests
    assert seen["body"] == body
    assert seen["path"] == CHAT
    assert seen["headers"][b"content-type"] == b"application/json; charset=utf-8"
    assert engines["west"].requests == []


async def test_haru_credentials_and_cookies_are_not_forwarded(haru, engines, proxy_fleet):
    response = await haru.post(
        CHAT,
        content=chat_body(),
        headers={"authorization": "Bearer client-secret", "cookie": "sessionid=abc"},
    )
    assert response.status_code == 200
    seen = engines["east"].requests[0]["headers"]
    assert b"authorization" not in seen
    assert b"cookie" not in seen


async def test_status_and_content_type_come_back_without_hop_by_hop_headers(
    haru, engines, proxy_fleet
):
    engines["east"].status = 422
    response = await haru.post(CHAT, content=chat_body())
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/json"
    # The model server's own connection management, identity and cookies stay behind.
    assert "x-engine" not in response.headers
    assert "set-cookie" not in response.headers
    assert "keep-alive" not in response.headers.get("connection", "")


async def test_completions_go_to_the_completions_endpoint(haru, engines, proxy_fleet):
    response = await haru.post("/v1/completions", content=chat_body(prompt="hi"))
    assert response.status_code == 200
    assert engines["east"].paths() == ["/v1/completions"]


async def test_first_chunk_reaches_the_client_before_the_model_server_finishes(
    haru, engines, proxy_fleet
):
    east = engines["east"]
    east.mode = "stream"
    async with haru.stream("POST", CHAT, content=chat_body(stream=True)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        chunks = response.aiter_raw()
        first = await anext(chunks)
        # The model server is still holding its last chunk back: nothing was buffered whole.
        assert first == b"data: one\n\n"
        assert not east.finished
        east.release.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"data: two\n\ndata: [DONE]\n\n"
    assert east.finished


async def test_connections_to_the_model_server_are_reused(haru, engines, proxy_fleet):
    for _ in range(5):
        assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    assert len(engines["east"].requests) == 5
    # One pooled keep-alive connection carried them all (uvicorn tracks open connections).
    assert len(engines["east"].served.server.server_state.connections) == 1


async def test_concurrent_requests_all_arrive(haru, engines, proxy_fleet):
    responses = await asyncio.gather(*(haru.post(CHAT, content=chat_body()) for _ in range(20)))
    assert [r.status_code for r in responses] == [200] * 20
    assert len(engines["east"].requests) == 20
