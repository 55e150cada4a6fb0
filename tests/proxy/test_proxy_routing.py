"""Routing: the pointer re-read on every request, the snapshot cache, and the fail-open path."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from fleets.core.states import InferenceState
from fleets.models import Domain, Fleet, ModelBinding, Slot
from fleets.proxy import snapshots, store
from fleets.proxy.snapshots import RoutingCache
from fleets.services.operations import operation_request, operation_start
from fleets.services.route_pointer import route_switch
from fleets.services.transitions import slot_transition
from tests.proxy.conftest import CHAT, chat_body, closed_port, error_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def long_ttl(settings):
    """Keep snapshots fresh for a minute: whatever changes routing here does so inside the TTL.

    The pointer is read on every request (poll bound 0): these tests pin that path; the
    poll-bounded reuse is tested in test_proxy_hold.py.
    """
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 60_000, "chat_hold_poll_ms": 0}


def promote(fleet: Fleet, slug: str) -> int:
    """Promote `slug` with the real services: request, start, wake its slots, switch."""

    target = Domain.objects.get(fleet=fleet, slug=slug)
    result = operation_request(fleet=fleet, kind="promote", target_domain_id=str(target.id))
    operation_start(operation_id=result.operation.id)
    for slot in Slot.objects.filter(domain=target, kind="inference"):
        for state in (InferenceState.WAKING, InferenceState.PROBING, InferenceState.SERVING):
            assert slot_transition(slot_id=slot.id, to_state=state)
    fleet.refresh_from_db()
    revision = route_switch(
        fleet_id=fleet.id,
        operation_id=result.operation.id,
        target_domain_id=target.id,
        expected_active_id=fleet.active_domain_id,
        expected_revision=fleet.route_revision,
    )
    assert revision is not None
    return revision


@asynccontextmanager
async def store_outage():
    """Make the state store unreachable for the proxy, for real, then bring it back.

    Points the connection settings at something that refuses connections (a closed port on
    Postgres, an unopenable file on SQLite) and drops the proxy thread's open connection, so
    its next read has to connect and fails as a real outage does.
    """
    settings_dict = connections["default"].settings_dict
    saved = dict(settings_dict)
    if connections["default"].vendor == "postgresql":
        settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", str(closed_port())
    else:
        settings_dict["NAME"] = "/nonexistent-haru-dir/state.sqlite3"
    await store.run(store.connection_close)
    try:
        yield
    finally:
        settings_dict.update(saved)
        await store.run(store.connection_close)


async def test_pointer_move_takes_effect_on_the_next_request_inside_the_ttl(
    haru, engines, proxy_fleet
):
    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "east"
    await sync_to_async(promote)(proxy_fleet, "west")
    response = await haru.post(CHAT, content=chat_body())
    assert response.json()["engine"] == "west"
    assert len(engines["east"].requests) == 1


async def test_models_lists_what_the_active_domain_serves(haru, engines, proxy_fleet):
    response = await haru.get("/v1/models")
    assert response.status_code == 200
    document = response.json()
    assert document["object"] == "list"
    assert [m["id"] for m in document["data"]] == ["llama-small", "qwen-small"]
    assert all(m["object"] == "model" and isinstance(m["created"], int) for m in document["data"])

    def drop_llama_on_west():
        ModelBinding.objects.filter(domain__slug="west", name="llama-small").delete()

    await sync_to_async(drop_llama_on_west)()
    await sync_to_async(promote)(proxy_fleet, "west")
    assert [m["id"] for m in (await haru.get("/v1/models")).json()["data"]] == ["qwen-small"]


async def test_the_openai_sdk_retrieves_a_served_model_and_gets_404_for_others(
    haru, engines, proxy_fleet
):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(
        base_url=f"{haru.served.url}/v1",
        api_key="unused-in-dev-mode",
        default_headers={"X-Haru-Fleet": "demo"},
        max_retries=0,
    )
    model = await client.models.retrieve("qwen-small")
    assert (model.id, model.object, model.owned_by) == ("qwen-small", "model", "haru")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"
    listed = [m.id async for m in client.models.list()]
    assert listed == ["llama-small", "qwen-small"]
    await client.close()


async def test_retrieving_a_bound_model_that_is_not_serving_is_503(haru, engines, proxy_fleet):
    def llama_asleep():
        Slot.objects.filter(domain__slug="east", bindings__name="llama-small").update(
            state=InferenceState.SLEEPING
        )

    await sync_to_async(llama_asleep)()
    response = await haru.get("/v1/models/llama-small")
    assert error_of(response) == (503, "model_unavailable")
    # A model name may hold a slash; an unknown one is a 404 naming what is available.
    missing = await haru.get("/v1/models/org/other-model")
    assert error_of(missing) == (404, "model_not_found")


async def test_fleet_is_found_by_uuid_and_by_slug_in_any_case(haru, engines, proxy_fleet):
    for ref in (str(proxy_fleet.id), str(proxy_fleet.id).upper(), "DEMO", proxy_fleet.id.hex):
        response = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": ref})
        assert response.status_code == 200, ref


async def test_store_outage_serves_the_cached_routing_marked_stale(haru, engines, proxy_fleet):
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    async with store_outage():
        response = await haru.post(CHAT, content=chat_body())
        assert response.status_code == 200
        assert response.headers["x-haru-routing"] == "stale"
        assert response.json()["engine"] == "east"
        models = await haru.get("/v1/models")
        assert models.status_code == 200
        assert models.headers["x-haru-routing"] == "stale"
        # Liveness never depends on the store.
        assert (await haru.get("/healthz")).status_code == 200
        metrics = (await haru.get("/metrics")).text
        assert 'haru_proxy_stale_routing_total{fleet="demo"}' in metrics
    recovered = await haru.post(CHAT, content=chat_body())
    assert recovered.status_code == 200
    assert "x-haru-routing" not in recovered.headers


async def test_store_outage_past_the_ttl_still_serves_stale(haru, engines, proxy_fleet, settings):
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 0}
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    async with store_outage():
        response = await haru.post(CHAT, content=chat_body())
    assert response.status_code == 200
    assert response.headers["x-haru-routing"] == "stale"


async def test_store_outage_with_a_cold_cache_is_503(haru, engines, proxy_fleet):
    async with store_outage():
        response = await haru.post(CHAT, content=chat_body())
        assert error_of(response) == (503, "state_store_unavailable")
        assert (await haru.get("/healthz")).status_code == 200
    assert engines["east"].requests == []


async def test_stale_routing_is_per_fleet_reference(haru, engines, proxy_fleet):
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    async with store_outage():
        other = await haru.post(CHAT, content=chat_body(), headers={"x-haru-fleet": "other"})
    assert error_of(other) == (503, "state_store_unavailable")


async def test_unknown_model_during_an_outage_is_marked_stale(haru, engines, proxy_fleet):
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    async with store_outage():
        response = await haru.post(CHAT, content=chat_body("gpt-4"))
    assert error_of(response) == (404, "model_not_found")
    assert response.headers["x-haru-routing"] == "stale"


async def test_a_gone_fleet_is_forgotten_under_every_alias(haru, engines, proxy_fleet):
    by_id = {"x-haru-fleet": str(proxy_fleet.id)}
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    assert (await haru.post(CHAT, content=chat_body(), headers=by_id)).status_code == 200
    await sync_to_async(Fleet.objects.filter(pk=proxy_fleet.pk).update)(slug="renamed")
    assert error_of(await haru.post(CHAT, content=chat_body())) == (404, "fleet_not_found")
    async with store_outage():
        # The store said "gone": no alias may resurrect the old routing during an outage.
        response = await haru.post(CHAT, content=chat_body(), headers=by_id)
    assert error_of(response) == (503, "state_store_unavailable")


async def test_malformed_state_fails_closed(haru, engines, proxy_fleet):
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east", name="qwen-small").update)(
        serving_url=f"{engines['east'].url}/x?next=/sleep"
    )
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "state_store_unavailable")
    assert engines["east"].requests == []


async def test_a_superseded_snapshot_is_never_served_again(haru, engines, proxy_fleet):
    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "east"
    # The pointer moves to a domain whose rows are unusable: fail closed...
    await sync_to_async(ModelBinding.objects.filter(domain__slug="west", name="qwen-small").update)(
        serving_url="http://127.0.0.1:1/?x"
    )
    await sync_to_async(promote)(proxy_fleet, "west")
    assert error_of(await haru.post(CHAT, content=chat_body())) == (503, "state_store_unavailable")
    # ...and an outage now must not bring east's routing back: it is known to be wrong.
    async with store_outage():
        response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "state_store_unavailable")
    assert len(engines["east"].requests) == 1


async def test_non_routing_state_refreshes_after_the_ttl(haru, engines, proxy_fleet, settings):
    # A short hold: the refusal is still held (and expires), without waiting out the default.
    settings.HARU = {**settings.HARU, "snapshot_cache_ttl_ms": 0, "chat_hold_ms": 200}
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200

    def fail_east():
        slot = Slot.objects.get(domain__slug="east", kind="inference")
        assert slot_transition(slot_id=slot.id, to_state="failed")

    await sync_to_async(fail_east)()
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "model_unavailable")
    assert "HARU_CHAT_HOLD_MS" in response.json()["error"]["message"]


async def test_metrics_count_requests_by_fleet_model_and_outcome(haru, engines, proxy_fleet):
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    assert (await haru.post(CHAT, content=chat_body("nope"))).status_code == 404
    text = (await haru.get("/metrics")).text
    assert 'haru_proxy_requests_total{fleet="demo",model="qwen-small",outcome="ok"}' in text
    # A model name the client made up never becomes a label value.
    assert 'haru_proxy_requests_total{fleet="demo",model="",outcome="model_not_found"}' in text
    assert 'model="nope"' not in text
    assert "haru_proxy_ttfb_seconds_bucket" in text
    assert "haru_proxy_overhead_seconds_bucket" in text


async def test_concurrent_pointer_reads_share_one_query_per_round(proxy_fleet, monkeypatch):
    reads = []
    real = store.pointer_read

    def counting(key, as_id):
        reads.append(key)
        return real(key, as_id)

    monkeypatch.setattr(store, "pointer_read", counting)
    cache = RoutingCache()
    # Ten requests ask in the same instant: the first starts a read, the other nine wait for
    # the next one (begun after they asked), so a pointer move is never missed.
    waits = [cache._pointer_read("demo", None) for _ in range(10)]
    pointers = await asyncio.gather(*waits)
    assert reads == ["demo", "demo"]
    assert {p.fleet_id for p in pointers} == {str(proxy_fleet.id)}


@pytest.mark.postgres
async def test_a_hung_store_costs_at_most_the_read_budget(haru, engines, proxy_fleet, monkeypatch):
    monkeypatch.setattr(snapshots, "POINTER_READ_TIMEOUT_S", 0.2)
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    accepted = []

    async def silent(reader, writer):  # accepts, reads, never answers: a wedged server
        accepted.append(writer)
        await reader.read()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    settings_dict = connections["default"].settings_dict
    saved = dict(settings_dict)
    settings_dict["HOST"] = "127.0.0.1"
    settings_dict["PORT"] = str(listener.sockets[0].getsockname()[1])
    await store.run(store.connection_close)
    try:
        response = await haru.post(CHAT, content=chat_body())
        assert response.status_code == 200
        assert response.headers["x-haru-routing"] == "stale"
    finally:
        settings_dict.update(saved)
        # Hanging up frees the database thread, still blocked in its connect.
        listener.close()
        for writer in accepted:
            writer.close()
        await store.run(store.connection_close)
    assert "x-haru-routing" not in (await haru.post(CHAT, content=chat_body())).headers


async def test_the_healthy_path_lookup_holds_until_the_poll_bound_and_the_settings_change(
    proxy_fleet, fake_clock, settings
):
    settings.HARU = {**settings.HARU, "chat_hold_poll_ms": 250, "snapshot_cache_ttl_ms": 60_000}
    cache = RoutingCache()
    await cache.resolve("demo")  # reads the pointer: fresh for 250 ms from now
    served = cache.cached("demo")
    assert served is not None and not served.stale
    fake_clock.advance(ms=249)
    assert cache.cached("demo") is served  # the same answer, no read
    fake_clock.advance(ms=2)
    assert cache.cached("demo") is None  # past the bound: the pointer must be read again
    await cache.resolve("demo")
    assert cache.cached("demo") is not None
    settings.HARU = {**settings.HARU, "chat_hold_poll_ms": 0}
    assert cache.cached("demo") is None  # a new bound counts at once
    # Another spelling of the reference is its own entry, and ends with the same pointer read.
    settings.HARU = {**settings.HARU, "chat_hold_poll_ms": 250}
    await cache.resolve(" DEMO ")
    assert cache.cached(" DEMO ") is not None and cache.cached("demo") is not None
    fake_clock.advance(ms=251)
    assert cache.cached(" DEMO ") is None and cache.cached("demo") is None
