"""Every error the proxy answers, each in the envelope with its status and code."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from fleets.layouts.loader import parse_layout
from fleets.models import Fleet, ModelBinding, Slot
from fleets.services.layouts import layout_apply
from fleets.services.transitions import slot_transition
from tests.proxy.conftest import CHAT, chat_body, closed_port, error_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def haru_settings(settings):
    """Change settings.HARU keys for one test (the in-loop server reads them live)."""

    def apply(**changes):
        settings.HARU = {**settings.HARU, **changes}

    return apply


async def test_missing_or_wrong_token_is_unauthorized(haru, engines, proxy_fleet, api_token):
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {api_token}"}):
        response = await haru.post(CHAT, content=chat_body(), headers=headers)
        assert error_of(response) == (401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert engines["east"].requests == []
    ok = await haru.post(
        CHAT, content=chat_body(), headers={"authorization": f"Bearer {api_token}"}
    )
    assert ok.status_code == 200


async def test_a_tab_before_the_token_is_accepted_as_everywhere(haru, proxy_fleet, api_token):
    # The chat gate reads the header with the REST API's and the supervisor's parse.
    ok = await haru.get("/v1/models", headers={"authorization": f"Bearer\t{api_token}"})
    assert ok.status_code == 200


async def test_models_listing_needs_the_token_too(haru, proxy_fleet, api_token):
    assert error_of(await haru.get("/v1/models")) == (401, "unauthorized")
    ok = await haru.get("/v1/models", headers={"authorization": f"Bearer {api_token}"})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"",
        b"[1, 2]",
        b'{"messages": []}',
        b'{"model": 7}',
        b'{"model": ""}',
        b"[" * 100_000,
        b'{"model": "a", "model": "b"}',
    ],
    ids=[
        "garbage",
        "empty",
        "array",
        "no-model",
        "model-not-string",
        "model-empty",
        "nested-100000-deep",
        "model-repeated",
    ],
)
async def test_a_body_without_a_usable_model_is_invalid(haru, engines, proxy_fleet, body):
    assert error_of(await haru.post(CHAT, content=body)) == (400, "invalid_request")
    assert engines["east"].requests == []


async def test_unknown_fleet_is_not_found(haru, proxy_fleet):
    response = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": "nope"})
    assert error_of(response) == (404, "fleet_not_found")
    odd = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": "../../etc"})
    assert error_of(odd) == (404, "fleet_not_found")


async def test_no_fleet_header_and_no_default_is_fleet_not_found(haru, proxy_fleet):
    response = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": ""})
    assert error_of(response) == (404, "fleet_not_found")
    assert "HARU_DEFAULT_FLEET" in response.json()["error"]["message"]


async def test_default_fleet_applies_without_the_header(haru, engines, proxy_fleet, haru_settings):
    haru_settings(default_fleet="demo")
    response = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": ""})
    assert response.status_code == 200


async def test_unknown_model_is_not_found_and_lists_what_is_available(haru, proxy_fleet):
    response = await haru.post(CHAT, content=chat_body("gpt-4"))
    assert error_of(response) == (404, "model_not_found")
    message = response.json()["error"]["message"]
    assert "llama-small" in message and "qwen-small" in message


async def test_model_match_is_exact(haru, engines, proxy_fleet):
    response = await haru.post(CHAT, content=chat_body("Qwen-Small"))
    assert error_of(response) == (404, "model_not_found")
    assert engines["east"].requests == []


async def test_a_bound_model_whose_slot_is_not_serving_is_unavailable(
    haru, proxy_fleet, haru_settings
):
    # A short hold: the refusal is still held (and expires), without waiting out the default.
    haru_settings(chat_hold_ms=200, chat_hold_poll_ms=50)

    def fail_east_inference():
        slot = Slot.objects.get(domain__fleet=proxy_fleet, domain__slug="east", kind="inference")
        assert slot_transition(slot_id=slot.id, to_state="failed")

    await sync_to_async(fail_east_inference)()
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "model_unavailable")
    assert response.headers["retry-after"] == "1"
    assert "HARU_CHAT_HOLD_MS" in response.json()["error"]["message"]


async def test_fleet_without_active_domain_is_503(haru, engines, layout_data):
    layout_data.pop("activeDomainSlug")
    layout_data["slug"] = "headless"
    await sync_to_async(layout_apply)(layout=parse_layout(layout_data))
    headers = {"x-haru-fleet": "headless"}
    response = await haru.post(CHAT, content=chat_body(), headers=headers)
    assert error_of(response) == (503, "no_active_domain")
    assert error_of(await haru.get("/v1/models", headers=headers)) == (503, "no_active_domain")


async def test_declared_oversize_body_is_refused_without_being_read(
    haru, engines, proxy_fleet, haru_settings
):
    haru_settings(chat_max_body_bytes=64)
    port = haru.served.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # Headers only: a server that waited for the body would never answer.
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-haru-fleet: demo\r\n"
        b"content-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")
    assert engines["east"].requests == []


async def test_chunked_body_is_refused_once_it_passes_the_limit(
    haru, engines, proxy_fleet, haru_settings
):
    haru_settings(chat_max_body_bytes=64)
    reader, writer = await asyncio.open_connection("127.0.0.1", haru.served.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-haru-fleet: demo\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    # 100 bytes in two chunks, and never the terminating chunk: the answer must not wait for it.
    writer.write(b"32\r\n" + b"x" * 50 + b"\r\n" + b"32\r\n" + b"y" * 50 + b"\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413")
    assert b"payload_too_large" in await asyncio.wait_for(reader.read(1000), 10)
    assert engines["east"].requests == []


async def test_body_at_the_limit_passes(haru, engines, proxy_fleet, haru_settings):
    body = chat_body()
    haru_settings(chat_max_body_bytes=len(body))
    assert (await haru.post(CHAT, content=body)).status_code == 200
    haru_settings(chat_max_body_bytes=len(body) - 1)
    assert error_of(await haru.post(CHAT, content=body)) == (413, "payload_too_large")


async def test_model_server_down_is_upstream_unreachable(haru, proxy_fleet, haru_settings):
    haru_settings(chat_hold_ms=0)  # holding off: the refusal is answered at once
    await sync_to_async(
        ModelBinding.objects.filter(domain__fleet=proxy_fleet, name="qwen-small").update
    )(serving_url=f"http://127.0.0.1:{closed_port()}")
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (502, "upstream_unreachable")
    # Worth a retry (a restart, a failover): SDKs honour Retry-After.
    assert response.headers["retry-after"] == "1"
    # The message names the model, not the internal address.
    assert "127.0.0.1" not in response.json()["error"]["message"]


async def test_model_server_down_for_the_whole_hold_is_503_with_retry_after(
    haru, proxy_fleet, haru_settings
):
    haru_settings(chat_hold_ms=300, chat_hold_poll_ms=50)
    await sync_to_async(
        ModelBinding.objects.filter(domain__fleet=proxy_fleet, name="qwen-small").update
    )(serving_url=f"http://127.0.0.1:{closed_port()}")
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "model_unavailable")
    assert response.headers["retry-after"] == "1"
    assert "HARU_CHAT_HOLD_MS" in response.json()["error"]["message"]
    assert "127.0.0.1" not in response.json()["error"]["message"]


async def test_no_headers_within_the_budget_is_upstream_timeout(
    haru, engines, proxy_fleet, haru_settings
):
    haru_settings(chat_header_timeout_ms=200)
    engines["east"].mode = "hang_headers"
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (504, "upstream_timeout")
    # Giving up on the headers also hangs up on the model server.
    await asyncio.wait_for(engines["east"].cancelled_event.wait(), 10)
    assert engines["east"].cancelled == 1


async def test_wrong_method_is_refused(haru, proxy_fleet):
    response = await haru.get(CHAT)
    assert error_of(response) == (405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    assert error_of(await haru.post("/v1/models")) == (405, "method_not_allowed")


async def test_errors_are_json_envelopes(haru, proxy_fleet):
    response = await haru.post(CHAT, content=b"{", headers={"x-haru-fleet": "demo"})
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"error"}
    assert set(response.json()["error"]) == {"code", "message"}


async def test_gone_fleet_is_not_found(haru, proxy_fleet, haru_settings):
    haru_settings(chat_hold_poll_ms=50)
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    await sync_to_async(Fleet.objects.filter(pk=proxy_fleet.pk).update)(slug="renamed")
    # Nothing pushed this change: the proxy sees it once its poll bound has passed.
    await asyncio.sleep(0.06)
    assert error_of(await haru.post(CHAT, content=chat_body())) == (404, "fleet_not_found")
