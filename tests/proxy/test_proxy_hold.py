"""Hold and forward: requests the active cannot take wait for the routing change, then go through.

Real servers on real sockets (conftest): Haru's ASGI app, two model-server doubles, and for the
"accepted, then cut" cases a raw TCP server that drops the connection mid-answer.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleets.base import clock
from fleets.core.states import InferenceState
from fleets.models import Domain, Fleet, ModelBinding, Operation, Slot
from fleets.proxy import hold
from fleets.proxy.push import FEED
from fleets.services.route_pointer import route_switch
from fleets.services.transitions import slot_transition
from tests.proxy.conftest import CHAT, chat_body, closed_port, error_of
from tests.proxy.test_proxy_routing import promote

pytestmark = pytest.mark.django_db(transaction=True)


async def east_refuses(fleet) -> None:
    """Point east's qwen-small at a port nothing listens on: every connect is refused."""
    await sync_to_async(
        ModelBinding.objects.filter(
            domain__fleet=fleet, domain__slug="east", name="qwen-small"
        ).update
    )(serving_url=f"http://127.0.0.1:{closed_port()}")


async def until_held(count: int) -> None:
    async with asyncio.timeout(10):
        while hold.HOLDS.count != count:
            await asyncio.sleep(0.01)


def released(outcome: str) -> float:
    return hold.RELEASED.labels(outcome)._value.get()


async def test_a_refused_request_is_forwarded_once_after_the_switch(
    haru, engines, proxy_fleet, hold_settings
):
    await east_refuses(proxy_fleet)
    forwarded = released("forwarded")
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    assert not request.done()
    assert engines["west"].requests == []
    await sync_to_async(promote)(proxy_fleet, "west")
    # The poll bound is 10 s: only the pushed revision can wake it within this timeout.
    response = await asyncio.wait_for(request, 5)
    assert response.status_code == 200
    assert response.json()["engine"] == "west"
    assert len(engines["west"].requests) == 1  # exactly once upstream
    assert hold.HOLDS.count == 0
    assert released("forwarded") == forwarded + 1


async def test_a_switch_pushed_while_the_request_is_being_refused_is_not_missed(
    haru, engines, proxy_fleet, hold_settings
):
    # Routing moves while the request is still out on the active (which then answers 503): the
    # push came before the request began to wait for one, and must not be waited for again (the
    # next push may never come; the poll bound is 10 s).
    east = engines["east"]
    east.status, east.gate = 503, asyncio.Event()
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    async with asyncio.timeout(5):
        while not east.requests:
            await asyncio.sleep(0.01)
    await sync_to_async(promote)(proxy_fleet, "west")
    east.gate.set()
    response = await asyncio.wait_for(request, 5)
    assert response.status_code == 200 and response.json()["engine"] == "west"
    assert hold.HOLDS.count == 0


async def test_a_503_from_the_engine_is_held_and_sent_to_the_new_active(
    haru, engines, proxy_fleet, hold_settings
):
    engines["east"].status = 503
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    await sync_to_async(promote)(proxy_fleet, "west")
    response = await asyncio.wait_for(request, 5)
    assert response.json()["engine"] == "west"
    assert len(engines["west"].requests) == 1


async def test_a_model_not_serving_on_the_active_is_held_until_the_promotion(
    haru, engines, proxy_fleet, hold_settings
):
    def fail_east():
        slot = Slot.objects.get(domain__slug="east", kind="inference")
        assert slot_transition(slot_id=slot.id, to_state="failed")

    await sync_to_async(fail_east)()
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    await sync_to_async(promote)(proxy_fleet, "west")
    response = await asyncio.wait_for(request, 5)
    assert response.json()["engine"] == "west"
    assert engines["east"].requests == []


async def test_the_poll_takes_over_without_a_push(haru, engines, proxy_fleet, hold_settings):
    """A model server that comes back in place (no routing change) is found by the retry."""
    hold_settings(chat_hold_poll_ms=50)
    engines["east"].status = 503
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    engines["east"].status = 200
    response = await asyncio.wait_for(request, 5)
    assert response.json()["engine"] == "east"
    assert [r["path"] for r in engines["east"].requests].count(CHAT) >= 2


class Cutter:
    """A model server that takes the request, answers part of it, then drops the connection."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        self.requests += 1
        writer.write(self.answer)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # accepted, then closed before any byte: it may have run
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"\r\nb\r\ndata: one\n\n\r\n",  # a stream cut mid-body
    ],
    ids=["closed-before-headers", "stream-cut-mid-body"],
)
async def test_a_request_the_upstream_accepted_is_never_sent_twice(
    haru, engines, proxy_fleet, hold_settings, answer
):
    cutter = Cutter(answer)
    server = await asyncio.start_server(cutter.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # An engine that cannot continue: what it accepted is never asked again (the continuing
    # engines' re-run is in test_proxy_continuation.py).
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east", name="qwen-small").update)(
        serving_url=f"http://127.0.0.1:{port}", profile={"engine": "sglang"}
    )
    try:
        if answer:
            with pytest.raises(httpx.RemoteProtocolError):
                async with haru.stream("POST", CHAT, content=chat_body(stream=True)) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_raw():
                        pass
        else:
            response = await haru.post(CHAT, content=chat_body())
            assert error_of(response) == (502, "upstream_unreachable")
            assert response.headers["retry-after"] == "1"
    finally:
        server.close()
    await sync_to_async(promote)(proxy_fleet, "west")
    assert cutter.requests == 1
    assert hold.HOLDS.count == 0
    # Another client is unaffected: the next request goes through on the new active.
    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "west"
    assert len(engines["west"].requests) == 1


async def test_past_the_cap_the_answer_is_503_with_retry_after(
    haru, engines, proxy_fleet, hold_settings
):
    hold_settings(chat_hold_max=1)
    await east_refuses(proxy_fleet)
    refused = released("refused_cap")
    first = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "hold_capacity_exceeded")
    assert response.headers["retry-after"] == "1"
    assert released("refused_cap") == refused + 1
    await sync_to_async(promote)(proxy_fleet, "west")
    assert (await asyncio.wait_for(first, 5)).json()["engine"] == "west"


async def test_past_the_byte_cap_the_answer_is_503_at_once(
    haru, engines, proxy_fleet, hold_settings
):
    body = chat_body()
    hold_settings(chat_hold_max_bytes=len(body) * 2 - 1)  # room for one body, not two
    await east_refuses(proxy_fleet)
    first = asyncio.create_task(haru.post(CHAT, content=body))
    await until_held(1)
    assert hold.HOLDS.bytes == len(body)
    assert error_of(await haru.post(CHAT, content=body)) == (503, "hold_capacity_exceeded")
    await sync_to_async(promote)(proxy_fleet, "west")
    assert (await asyncio.wait_for(first, 5)).json()["engine"] == "west"
    assert hold.HOLDS.bytes == 0


async def test_an_expired_hold_is_503_with_retry_after(haru, engines, proxy_fleet, hold_settings):
    hold_settings(chat_hold_ms=200, chat_hold_poll_ms=50)
    await east_refuses(proxy_fleet)
    expired = released("expired")
    response = await haru.post(CHAT, content=chat_body())
    assert error_of(response) == (503, "model_unavailable")
    assert response.headers["retry-after"] == "1"
    assert released("expired") == expired + 1
    assert hold.HOLDS.count == 0


async def test_a_client_that_leaves_while_held_frees_its_slot_at_once(
    haru, engines, proxy_fleet, hold_settings
):
    await east_refuses(proxy_fleet)
    gone = released("disconnected")
    request = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    request.cancel()  # httpx closes the connection: Haru sees http.disconnect
    await until_held(0)
    assert released("disconnected") == gone + 1
    await sync_to_async(promote)(proxy_fleet, "west")
    await asyncio.sleep(0.1)
    assert engines["west"].requests == []  # nobody to answer: never forwarded


async def test_holding_off_answers_at_once(haru, engines, proxy_fleet, hold_settings):
    hold_settings(chat_hold_ms=0)
    await east_refuses(proxy_fleet)
    assert error_of(await haru.post(CHAT, content=chat_body())) == (502, "upstream_unreachable")
    assert hold.HOLDS.count == 0


async def test_the_pointer_is_reused_within_the_poll_bound_and_a_push_ends_it(
    haru, engines, proxy_fleet, hold_settings
):
    """The healthy path skips the pointer read within the bound; a pushed revision re-reads."""
    from fleets.models import Fleet  # noqa: PLC0415 - local to this test's raw update

    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "east"

    def wake_west():
        for slot in Slot.objects.filter(domain__slug="west", kind="inference"):
            for state in ("waking", "probing", "serving"):
                assert slot_transition(slot_id=slot.id, to_state=state)
        return proxy_fleet.domains.get(slug="west")

    west = await sync_to_async(wake_west)()
    # A move nobody announces (a raw update): invisible within the 10 s poll bound...
    await sync_to_async(Fleet.objects.filter(pk=proxy_fleet.pk).update)(
        active_domain=west, route_revision=proxy_fleet.route_revision + 5
    )
    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "east"
    # ...until its revision is pushed.
    FEED.publish(str(proxy_fleet.id), proxy_fleet.route_revision + 5)
    assert (await haru.post(CHAT, content=chat_body())).json()["engine"] == "west"


async def test_a_refused_connection_is_reported_to_the_reconciler(
    haru, engines, proxy_fleet, hold_settings, monkeypatch
):
    """The contract's data-path report: fleet, the active domain, the model, when it failed."""
    from fleets.reconciler import datapath  # noqa: PLC0415 - patched at its module boundary

    reports = []
    monkeypatch.setattr(datapath, "report_unreachable", lambda *args: reports.append(args))
    hold_settings(chat_hold_ms=0)
    await east_refuses(proxy_fleet)
    before = time.time()
    assert error_of(await haru.post(CHAT, content=chat_body())) == (502, "upstream_unreachable")
    east = await sync_to_async(lambda: proxy_fleet.domains.get(slug="east"))()
    assert len(reports) == 1
    fleet_id, domain_id, model, failed_at = reports[0]
    assert (fleet_id, domain_id, model) == (str(proxy_fleet.id), str(east.id), "qwen-small")
    assert before <= failed_at <= time.time()
    # A model server that answers (even 503) is reachable: nothing to report.
    engines["east"].status = 503
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east", name="qwen-small").update)(
        serving_url=engines["east"].url
    )
    hold_settings(chat_hold_ms=0, chat_hold_poll_ms=0, snapshot_cache_ttl_ms=0)
    assert error_of(await haru.post(CHAT, content=chat_body())) == (503, "model_unavailable")
    assert len(reports) == 1


async def test_the_hold_series_are_exported(haru, engines, proxy_fleet, hold_settings):
    hold_settings(chat_hold_ms=100, chat_hold_poll_ms=20)
    await east_refuses(proxy_fleet)
    assert (await haru.post(CHAT, content=chat_body())).status_code == 503
    text = (await haru.get("/metrics")).text
    assert "haru_proxy_held " in text or "haru_proxy_held{" in text
    assert "haru_proxy_holds_total" in text
    assert 'haru_proxy_hold_released_total{outcome="expired"}' in text
    assert 'haru_proxy_hold_seconds_bucket{le="0.25",outcome="expired"}' in text


async def test_a_round_trip_drill_holds_requests_across_each_switch(
    haru, engines, proxy_fleet, hold_settings
):
    """Routing moves twice under a round-trip drill, each by the switch CAS: a request the
    domain losing traffic cannot take waits for each move and goes through, exactly once."""

    def start_drill() -> Operation:
        east = Domain.objects.get(fleet=proxy_fleet, slug="east")
        west = Domain.objects.get(fleet=proxy_fleet, slug="west")
        for slot in Slot.objects.filter(domain=west, kind="inference"):
            for state in (InferenceState.WAKING, InferenceState.PROBING, InferenceState.SERVING):
                assert slot_transition(slot_id=slot.id, to_state=state)
        return Operation.objects.create(
            fleet=proxy_fleet,
            kind="drill",
            drill_mode="round_trip",
            state="running",
            target_domain=west,
            source_domain=east,
            created_at=clock.now(),
        )

    def switch(op: Operation, to_slug: str) -> None:
        fleet = Fleet.objects.get(pk=proxy_fleet.pk)
        to = Domain.objects.get(fleet=fleet, slug=to_slug)
        assert route_switch(
            fleet_id=fleet.id,
            operation_id=op.id,
            target_domain_id=to.id,
            expected_active_id=fleet.active_domain_id,
            expected_revision=fleet.route_revision,
        )

    op = await sync_to_async(start_drill)()
    # There: east (being demoted) refuses; the held request goes to west after the switch.
    engines["east"].status = 503
    there = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    await sync_to_async(switch)(op, "west")
    response = await asyncio.wait_for(there, 5)
    assert response.json()["engine"] == "west"
    # And back: west (now being demoted) refuses; the held request goes to east.
    engines["east"].status = 200
    engines["west"].status = 503
    back = asyncio.create_task(haru.post(CHAT, content=chat_body()))
    await until_held(1)
    await sync_to_async(switch)(op, "east")
    response = await asyncio.wait_for(back, 5)
    assert response.json()["engine"] == "east"
    assert hold.HOLDS.count == 0
