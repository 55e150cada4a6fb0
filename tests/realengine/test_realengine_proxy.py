"""The chat proxy in front of a real vLLM: plain and streamed chat, completions, the official
OpenAI SDK, and vLLM's own 404 passed through unchanged."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async

from fleets.layouts.loader import parse_layout
from fleets.services.layouts import layout_apply
from tests.proxy.conftest import CHAT, closed_port, haru, proxy_isolation  # noqa: F401
from tests.realengine.conftest import MODEL

pytestmark = [pytest.mark.realengine, pytest.mark.django_db(transaction=True)]

GHOST = "ghost"  # bound in the layout, unknown to the engine: vLLM itself answers 404


@pytest.fixture
async def routed(engines, layout_data):
    """The demo fleet with east's inference slot bound to the real vLLM."""

    for domain in layout_data["domains"]:
        for slot in domain["slots"]:
            if slot["kind"] != "inference":
                continue
            url = (
                engines.plain.url
                if domain["slug"] == "east"
                else f"http://127.0.0.1:{closed_port()}"
            )
            # The example plans its GPUs, so each model states its memory need.
            slot["models"] = [
                {"name": MODEL, "servingUrl": url, "memoryMiB": 8192},
                {"name": GHOST, "servingUrl": url, "memoryMiB": 8192},
            ]
    await sync_to_async(layout_apply)(layout=parse_layout(layout_data))
    async with httpx.AsyncClient(base_url=engines.plain.url, trust_env=False) as engine:
        await engine.post("/wake_up")
    return engines.plain


def body(**extra) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}
    ).encode()


async def test_non_streaming_chat_through_the_proxy(haru, routed):  # noqa: F811
    response = await haru.post(CHAT, content=body())
    assert response.status_code == 200
    answer = response.json()
    assert answer["model"] == MODEL and answer["object"] == "chat.completion"
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")


async def test_streaming_chat_through_the_proxy(haru, routed):  # noqa: F811
    async with haru.stream("POST", CHAT, content=body(stream=True)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][len("data: ") :])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_completions_through_the_proxy(haru, routed):  # noqa: F811
    payload = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()
    response = await haru.post("/v1/completions", content=payload)
    assert response.status_code == 200
    assert response.json()["object"] == "text_completion"


async def test_vllms_own_404_is_passed_through(haru, routed):  # noqa: F811
    response = await haru.post(CHAT, content=body(model=GHOST))
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": f"The model `{GHOST}` does not exist. Valid aliases: {MODEL}.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


async def test_the_official_openai_sdk_through_the_proxy(haru, routed):  # noqa: F811
    async with httpx.AsyncClient(trust_env=False, timeout=120) as http:
        client = openai.AsyncOpenAI(
            base_url=f"{haru.served.url}/v1",
            api_key="unused-by-haru",
            default_headers={"x-haru-fleet": "demo"},
            http_client=http,
            max_retries=0,
        )
        completion = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6
        )
        assert completion.model == MODEL and completion.choices[0].message.content is not None
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(
                model=GHOST, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert "does not exist" in str(missing.value)
