"""bench/proxy.py --client: the httpx and aiohttp stand-ins answer like the proxy's own client,
so what the benchmark compares is the client's cost, not a different behaviour."""

from __future__ import annotations

import pytest

from fleets.proxy import upstream
from tests.proxy.conftest import CHAT, chat_body

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
async def test_each_library_client_carries_a_chat_request_unchanged(
    client, haru, engines, proxy_fleet, monkeypatch
):
    # Imported here, after the `haru` fixture: it imports haru.asgi, as that fixture does.
    from bench import upstream_clients  # noqa: PLC0415 - imports haru.asgi, which builds the app at import

    monkeypatch.setattr(upstream_clients, "CLIENT", client)
    monkeypatch.setattr(upstream, "open_stream", upstream_clients.open_stream)
    body = chat_body()
    try:
        response = await haru.post(CHAT, content=body)
        assert response.status_code == 200
        assert response.json() == {"engine": "east", "path": "/v1/chat/completions"}
        assert engines["east"].requests[-1]["body"] == body
    finally:
        await upstream_clients.clients_close()


def test_the_request_head_is_turned_back_into_url_and_headers(haru):
    from bench import upstream_clients  # noqa: PLC0415 - imports haru.asgi, which builds the app at import

    target = upstream.Target("http", "127.0.0.1", 8001, b"127.0.0.1:8001", b"/v1/chat/completions")
    head = upstream.request_head(target, {b"authorization": b"Bearer x"}, 2)
    url, headers = upstream_clients._split_head(target, head)
    assert url == "http://127.0.0.1:8001/v1/chat/completions"
    names = [n for n, _ in headers]
    assert "host" not in names and "content-length" not in names
    assert ("content-type", "application/json") in headers
