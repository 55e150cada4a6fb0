"""The proxy only ever calls a binding's inference endpoints: never /sleep, never /wake_up."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from fleets.models import ModelBinding
from fleets.proxy.snapshots import Malformed, upstream_targets
from tests.proxy.conftest import CHAT, chat_body, error_of

pytestmark = pytest.mark.django_db(transaction=True)

SNEAKY_MODELS = [
    "../sleep",
    "/sleep",
    "qwen-small/../../sleep",
    "qwen-small/../../wake_up",
    "qwen-small?level=1",
    "qwen-small#/wake_up",
    "qwen-small/../sleep?level=1#x",
    "qwen-small%2F..%2Fsleep",
    "qwen-small\r\nX-Injected: 1",
]


@pytest.mark.parametrize("model", SNEAKY_MODELS)
async def test_a_model_name_cannot_steer_the_upstream_path(haru, engines, proxy_fleet, model):
    response = await haru.post(CHAT, content=chat_body(model))
    assert error_of(response) == (404, "model_not_found")
    assert engines["east"].requests == []
    assert engines["west"].requests == []


async def raw_post(port: int, target: bytes, body: bytes) -> bytes:
    """Send a request line exactly as given (no client-side path normalization)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST " + target + b" HTTP/1.1\r\nhost: 127.0.0.1\r\nx-haru-fleet: demo\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % len(body)
        + body
    )
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/chat/completions/../../sleep",
        b"/v1/chat/completions/..%2F..%2Fsleep",
        b"/v1/chat/completions%2F..%2F..%2Fwake_up",
        b"/v1/../sleep?level=1",
        b"/sleep?level=1",
        b"/wake_up",
    ],
)
async def test_a_request_path_cannot_reach_the_control_endpoints(
    haru, engines, proxy_fleet, target
):
    answer = await raw_post(haru.served.port, target, chat_body())
    assert not answer.startswith(b"HTTP/1.1 200")
    assert engines["east"].requests == []


async def test_query_and_fragment_of_the_request_are_not_forwarded(haru, engines, proxy_fleet):
    answer = await raw_post(haru.served.port, b"/v1/chat/completions?next=/sleep", chat_body())
    assert answer.startswith(b"HTTP/1.1 200")
    [seen] = engines["east"].requests
    assert (seen["path"], seen["query"]) == (CHAT, b"")


async def test_a_redirect_from_the_model_server_is_not_followed(haru, engines, proxy_fleet):
    engines["east"].mode = "redirect"
    response = await haru.post(CHAT, content=chat_body())
    assert response.status_code == 307
    assert "location" not in response.headers
    assert engines["east"].paths() == [CHAT]
    assert engines["east"].control_hits == 0


async def test_only_the_serving_url_prefix_precedes_the_endpoint(haru, engines, proxy_fleet):
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east", name="qwen-small").update)(
        serving_url=f"{engines['east'].url}/engine-a/"
    )
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    assert engines["east"].paths() == ["/engine-a/v1/chat/completions"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/sleep?x=",
        "http://127.0.0.1:8000/#frag",
        "http://127.0.0.1:8000/a/../sleep",
        "http://127.0.0.1:8000/a/%2e%2e/sleep",
        "http://user:pw@127.0.0.1:8000",
        "ftp://127.0.0.1:8000",
        "127.0.0.1:8000",
        "http://127.0.0.1:99999",
    ],
)
def test_unusable_serving_urls_are_malformed(url):
    with pytest.raises(Malformed):
        upstream_targets(url)


def test_targets_end_in_the_inference_endpoints():
    targets = upstream_targets("https://models.internal:8443/pool-1/")
    assert targets["chat"].path == b"/pool-1/v1/chat/completions"
    assert targets["completions"].path == b"/pool-1/v1/completions"
    assert (targets["chat"].host, targets["chat"].port) == ("models.internal", 8443)
    assert targets["chat"].host_header == b"models.internal:8443"
    assert upstream_targets("http://10.0.0.5")["chat"].port == 80


@pytest.mark.parametrize(
    "url", ["ftp://ops:hunter2@127.0.0.1:8000", "http://ops:hunter2@127.0.0.1:8000/?x=1"]
)
def test_a_malformed_serving_url_is_named_without_its_credentials(url):
    with pytest.raises(Malformed) as refused:
        upstream_targets(url)
    assert "127.0.0.1:8000" in str(refused.value) and "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1?key=k-5521", "http://127.0.0.1:8000#k-5521"]
)
def test_a_serving_url_s_query_or_fragment_is_never_shown(url):
    # The message reaches chat clients (503 malformed routing state); a query may hold a key.
    with pytest.raises(Malformed) as refused:
        upstream_targets(url)
    assert "k-5521" not in str(refused.value) and "127.0.0.1:8000" in str(refused.value)
