"""A client that goes away cancels its upstream request: the model server stops for nobody."""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.conftest import CHAT, chat_body

pytestmark = pytest.mark.django_db(transaction=True)


async def until(predicate, *, limit_s: float = 10.0) -> None:
    """Wait for `predicate()` to hold (the bound only stops a broken test from hanging)."""
    async with asyncio.timeout(limit_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_disconnect_mid_stream_cancels_the_upstream_request(haru, engines, proxy_fleet):
    east = engines["east"]
    east.mode = "hang_stream"
    async with haru.stream("POST", CHAT, content=chat_body(stream=True)) as response:
        assert await anext(response.aiter_raw()) == b"data: one\n\n"
    # Leaving the block with the body unread closed the client's connection.
    await asyncio.wait_for(east.cancelled_event.wait(), 10)
    assert east.cancelled == 1


async def test_disconnect_while_waiting_for_headers_cancels_the_upstream_request(
    haru, engines, proxy_fleet
):
    east = engines["east"]
    east.mode = "hang_headers"
    call = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until(lambda: east.requests)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(east.cancelled_event.wait(), 10)
    assert east.cancelled == 1


async def test_a_disconnect_is_counted_and_the_proxy_keeps_serving(haru, engines, proxy_fleet):
    east = engines["east"]
    east.mode = "hang_stream"
    async with haru.stream("POST", CHAT, content=chat_body(stream=True)) as response:
        await anext(response.aiter_raw())
    await asyncio.wait_for(east.cancelled_event.wait(), 10)
    east.mode = "json"
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    metrics = (await haru.get("/metrics")).text
    assert 'model="qwen-small",outcome="client_disconnected"}' in metrics
