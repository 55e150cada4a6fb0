"""A stream cut after its headers continues, token for token, on the domain routing commits to.

Real servers on real sockets: Haru's app and two vLLM-shaped doubles (tests/proxy/vllm_double.py)
that cut a stream as scripted and answer 503 afterwards, until the test promotes the other
domain (or brings the same one back). Every continued stream is compared byte for byte with
the uninterrupted stream the same double sends without ids.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleets.layouts.loader import parse_layout
from fleets.metrics import continuations as metrics
from fleets.models import Fleet, ModelBinding
from fleets.proxy import continuation, hold, snapshots, store
from fleets.services.layouts import layout_apply
from tests.proxy.conftest import CHAT, serving
from tests.proxy.test_proxy_hold import Cutter, until_held
from tests.proxy.test_proxy_routing import promote
from tests.proxy.vllm_double import ANSWER_IDS, VllmDouble, decode, prompt_ids_of_request

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETIONS = "/v1/completions"
PATHS = {"chat": CHAT, "completions": COMPLETIONS}
# A cut inside a multi-byte character of the answer ("ç" is two bytes, two ids here).
INSIDE = next(k for k in range(1, len(ANSWER_IDS)) if decode(ANSWER_IDS[:k]).endswith("\ufffd"))


@pytest.fixture
async def doubles():
    east, west = VllmDouble("east"), VllmDouble("west")
    east.wire = west.wire = "sim"  # as the example layout's engine
    async with serving(east) as e, serving(west) as w:
        east.url, west.url = e.url, w.url
        yield {"east": east, "west": west}


@pytest.fixture
async def fleet(doubles, layout_data):
    for domain in layout_data["domains"]:
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                model["servingUrl"] = doubles[domain["slug"]].url

    def seed():
        layout_apply(layout=parse_layout(layout_data))
        return Fleet.objects.get(slug=layout_data["slug"])

    return await sync_to_async(seed)()


async def use_wire(doubles, wire: str) -> None:
    """Make both domains' engines `wire` ("vllm" or "sim"), in the layout and on the wire."""
    for double in doubles.values():
        double.wire = wire
    await sync_to_async(ModelBinding.objects.update)(profile={"engine": wire})


def body(endpoint: str, **extra) -> dict:
    if endpoint == "chat":
        return {"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}], **extra}
    return {"model": "qwen-small", "prompt": "Say hi", **extra}


async def baseline(double: VllmDouble, endpoint: str, request: dict) -> bytes:
    """The uninterrupted stream, straight from a double, as a client would get it."""
    async with httpx.AsyncClient(base_url=double.url) as client:
        response = await client.post(PATHS[endpoint], json=request)
    double.requests.clear()
    return response.content


async def read_all(haru, endpoint: str, request: dict) -> bytes:
    async with haru.stream("POST", PATHS[endpoint], json=request) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


async def cut_then_promote(haru, fleet, endpoint: str, request: dict) -> bytes:
    reading = asyncio.create_task(read_all(haru, endpoint, request))
    await until_held(1)  # the cut stream is held like a new request
    assert not reading.done()
    await sync_to_async(promote)(fleet, "west")
    return await asyncio.wait_for(reading, 10)


def continued(endpoint: str) -> float:
    return metrics.CONTINUED.labels("demo", endpoint)._value.get()


def failures(reason: str) -> float:
    return metrics.FAILURES.labels("demo", reason)._value.get()


def stalls() -> float:
    """How many seam stalls the histogram observed for the demo fleet."""
    return sum(bucket.get() for bucket in metrics.SEAM_STALL.labels("demo")._buckets)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("cut", ["reset", "eof", "abort"])
@pytest.mark.parametrize("wire", ["vllm", "sim"])
async def test_a_cut_stream_continues_byte_for_byte_on_the_promoted_domain(
    haru, doubles, fleet, hold_settings, endpoint, cut, wire
):
    await use_wire(doubles, wire)
    request = body(endpoint, stream=True, max_tokens=80, stream_options={"include_usage": True})
    expected = await baseline(doubles["west"], endpoint, request)
    east, west = doubles["east"], doubles["west"]
    east.cut_after, east.cut = 30, cut
    before, stalled = continued(endpoint), stalls()

    got = await cut_then_promote(haru, fleet, endpoint, request)

    assert got == expected  # one id, one role chunk, one finish_reason, usage once, one [DONE]
    assert got.count(b"[DONE]") == 1 and got.count(b'"usage"') == 1
    assert b'"token_ids":[' not in got and b'"prompt_token_ids":[' not in got
    assert east.requests[0]["body"]["return_token_ids"] is True  # asked by the proxy
    (resumed,) = [r for r in west.requests if r["path"] == COMPLETIONS and not r["refused"]]
    # Interface 2: the prompt's ids and the 30 sent, the rest of max_tokens, ids asked.
    assert resumed["body"]["prompt"] == prompt_ids_of_request(endpoint == "chat") + ANSWER_IDS[:30]
    assert resumed["body"]["max_tokens"] == 50
    assert resumed["body"]["return_token_ids"] is True
    assert continued(endpoint) == before + 1
    assert stalls() == stalled + 1  # the seam's stall, observed once
    assert hold.HOLDS.count == 0


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("rewind", [False, True], ids=["clean-engine", "vllm-rewind"])
@pytest.mark.parametrize("wire", ["vllm", "sim"])
async def test_a_seam_inside_a_character_neither_drops_nor_repeats_text(
    haru, doubles, fleet, hold_settings, endpoint, rewind, wire
):
    await use_wire(doubles, wire)
    request = body(endpoint, stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], endpoint, request)
    doubles["east"].cut_after = INSIDE
    doubles["west"].rewind = rewind  # the continuing engine re-emits earlier text, as vLLM
    assert await cut_then_promote(haru, fleet, endpoint, request) == expected
    # The answer before the seam, then with the continuation's first text: two reads a seam.
    assert [r["path"] for r in doubles["west"].requests].count("/detokenize") == 2


async def until_asked(double: VllmDouble, path: str) -> None:
    async with asyncio.timeout(10):
        while not any(r["path"] == path for r in double.requests):
            await asyncio.sleep(0.01)


async def cut_then_promote_standby_read_first(
    haru, fleet, doubles, endpoint: str, request: dict, *, refused: bool = False
) -> bytes:
    """Cut, wait until the standby (west) was asked for the text before the seam while the
    stream is held, then promote it. `refused`: the standby answers 503 while held."""
    west = doubles["west"]
    west.refuse = refused
    reading = asyncio.create_task(read_all(haru, endpoint, request))
    await until_held(1)
    await until_asked(west, "/detokenize")
    west.refuse = False
    await sync_to_async(promote)(fleet, "west")
    return await asyncio.wait_for(reading, 10)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_the_text_before_the_seam_is_read_from_the_standby_while_held(
    haru, doubles, fleet, hold_settings, endpoint
):
    # The read goes while the stream waits for a domain, not in the burst after a failover's
    # routing commit: at the seam only the read with the continuation's ids is left.
    request = body(endpoint, stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], endpoint, request)
    doubles["east"].cut_after = INSIDE
    west = doubles["west"]
    got = await cut_then_promote_standby_read_first(haru, fleet, doubles, endpoint, request)
    assert got == expected
    paths = [r["path"] for r in west.requests]
    assert paths[0] == "/detokenize" and west.requests[0]["body"]["tokens"] == ANSWER_IDS[:INSIDE]
    assert paths.count(COMPLETIONS) == 1 and paths.count("/detokenize") == 2


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_the_text_before_the_seam_is_asked_for_while_the_engine_starts(
    haru, doubles, fleet, hold_settings, endpoint
):
    # The standby could not answer while held: the read is asked again with the continuation.
    request = body(endpoint, stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], endpoint, request)
    doubles["east"].cut_after = INSIDE
    west = doubles["west"]
    west.first_delay = 0.3  # the continuing engine's prefill
    got = await cut_then_promote_standby_read_first(
        haru, fleet, doubles, endpoint, request, refused=True
    )
    assert got == expected
    reads = [r for r in west.requests if r["path"] == "/detokenize" and not r["refused"]]
    # The answer before the seam was read before the continuation's first event, not after it:
    # at the seam only the read with the continuation's ids is left to wait for.
    assert [r["body"]["tokens"] for r in reads[:1]] == [ANSWER_IDS[:INSIDE]]
    assert reads[0]["events_sent"] == 0 and reads[1]["events_sent"] >= 1


async def test_the_text_before_the_seam_is_asked_for_with_the_continuation(
    haru, doubles, fleet, hold_settings
):
    # An engine slow to answer at all (its queue, after a failover), whose read while held
    # failed: the read of the text before the seam goes with the continuation, not after the
    # continuation's headers.
    request = body("chat", stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], "chat", request)
    doubles["east"].cut_after = INSIDE
    west = doubles["west"]
    west.headers_delay = 0.3
    got = await cut_then_promote_standby_read_first(
        haru, fleet, doubles, "chat", request, refused=True
    )
    assert got == expected
    reads = [r for r in west.requests if r["path"] == "/detokenize" and not r["refused"]]
    assert [r["body"]["tokens"] for r in reads[:1]] == [ANSWER_IDS[:INSIDE]]
    assert reads[0]["headers_sent"] is False


async def test_a_read_ahead_the_standby_never_answers_does_not_hold_the_seam(
    haru, doubles, fleet, hold_settings
):
    # The standby dropped the read made while held, then took the continuation: the seam asks
    # again at once instead of waiting out the header timeout (30 s) and ending the stream cut.
    request = body("chat", stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], "chat", request)
    doubles["east"].cut_after = INSIDE
    west = doubles["west"]
    west.hang_detokenize = 1
    got = await cut_then_promote_standby_read_first(haru, fleet, doubles, "chat", request)
    assert got == expected
    assert [r["path"] for r in west.requests].count("/detokenize") == 3  # ahead, again, seam


async def test_a_held_continuation_asks_the_dead_engine_for_its_text_once(
    haru, doubles, fleet, hold_settings
):
    # Held, the continuation is tried on the dead route every poll; the text before the seam is
    # asked there once (a request per held stream per poll would load a failover's proxy).
    hold_settings(chat_hold_poll_ms=20)
    request = body("chat", stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], "chat", request)
    east = doubles["east"]
    east.cut_after = INSIDE
    reading = asyncio.create_task(read_all(haru, "chat", request))
    await until_held(1)
    tried = len(east.requests)
    # It keeps trying the route: every poll, or on a doubling backoff while a push channel
    # (PostgreSQL, Redis) is up.
    async with asyncio.timeout(10):
        while len(east.requests) < tried + 4:
            await asyncio.sleep(0.01)
    await sync_to_async(promote)(fleet, "west")
    assert await asyncio.wait_for(reading, 10) == expected
    assert [r["path"] for r in east.requests].count("/detokenize") <= 1


async def test_the_same_domain_coming_back_takes_the_continuation(
    haru, doubles, fleet, hold_settings
):
    hold_settings(chat_hold_poll_ms=50)
    east = doubles["east"]
    request = body("chat", stream=True, max_tokens=70)
    expected = await baseline(east, "chat", request)
    east.cut_after = 25
    reading = asyncio.create_task(read_all(haru, "chat", request))
    await until_held(1)
    east.cut_after, east.refuse = None, False  # back in place, no routing change
    assert await asyncio.wait_for(reading, 10) == expected
    # The standby was only read for the text before the seam while the stream was held; the
    # continuation went to the domain that came back, which read that text again.
    assert [r["path"] for r in doubles["west"].requests] == ["/detokenize"]
    assert [r["path"] for r in east.requests].count("/detokenize") >= 1


async def test_a_stream_silent_past_the_bound_is_cut_and_continued(
    haru, doubles, fleet, hold_settings
):
    hold_settings(chat_stream_stall_ms=300)
    request = body("chat", stream=True, max_tokens=50)
    expected = await baseline(doubles["west"], "chat", request)
    doubles["east"].cut_after, doubles["east"].cut = 20, "hang"
    assert await cut_then_promote(haru, fleet, "chat", request) == expected


async def test_a_stop_string_split_by_the_seam_ends_the_answer(haru, doubles, fleet, hold_settings):
    # "Bonjour, ça va?": cut after "Bonjour, " leaves "ça" for the continuation; the stop
    # ", ç" starts before the seam, which the continuing engine never sees as text.
    await use_wire(doubles, "vllm")  # the simulator writes no stop_reason without ids
    seam = len(b"Bonjour, ")
    request = body("completions", stream=True, max_tokens=60, stop=[", ç"])
    doubles["east"].cut_after = seam
    got = await cut_then_promote(haru, fleet, "completions", request)
    events = [json.loads(line[6:]) for line in got.split(b"\n\n") if line.startswith(b"data: {")]
    text = "".join(e["choices"][0]["text"] for e in events)
    assert text == "Bonjour"  # without the stop string, as vLLM answers
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["stop_reason"] == ", ç"
    assert got.endswith(b"data: [DONE]\n\n") and got.count(b"[DONE]") == 1


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
async def test_what_cannot_continue_ends_as_today_and_is_sent_untouched(
    haru, doubles, fleet, hold_settings, extra, reason
):
    request = body("chat", stream=True, max_tokens=60, **extra)
    doubles["east"].cut_after = 20
    with pytest.raises(httpx.RemoteProtocolError):
        await read_all(haru, "chat", request)
    assert "return_token_ids" not in doubles["east"].requests[0]["body"]
    assert doubles["west"].requests == []


async def test_an_engine_that_cannot_return_ids_ends_as_today(haru, doubles, fleet, hold_settings):
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east").update)(
        profile={"engine": "sglang"}
    )
    doubles["east"].cut_after = 20
    with pytest.raises(httpx.RemoteProtocolError):
        await read_all(haru, "chat", body("chat", stream=True, max_tokens=60))
    assert "return_token_ids" not in doubles["east"].requests[0]["body"]


async def test_an_engine_that_ignores_the_id_request_ends_as_today(
    haru, doubles, fleet, hold_settings
):
    doubles["east"].token_ids = False
    doubles["east"].cut_after = 20
    before = failures("no_ids")
    with pytest.raises(httpx.RemoteProtocolError):
        await read_all(haru, "chat", body("chat", stream=True, max_tokens=60))
    assert failures("no_ids") == before + 1
    assert doubles["west"].requests == []


async def test_a_continuation_cut_again_is_continued_again_up_to_the_bound(
    haru, doubles, fleet, hold_settings
):
    hold_settings(chat_hold_poll_ms=50, chat_continue_max=2)
    east, west = doubles["east"], doubles["west"]
    request = body("completions", stream=True, max_tokens=90)
    expected = await baseline(west, "completions", request)
    east.cut_after = 20
    reading = asyncio.create_task(read_all(haru, "completions", request))
    await until_held(1)
    west.cut_after, west.delay = 15, 0.01  # the first continuation is cut too, after its seam
    await sync_to_async(promote)(fleet, "west")
    async with asyncio.timeout(10):
        while west.cuts != 1:
            await asyncio.sleep(0.01)
    west.cut_after, west.refuse = None, False  # back: the second continuation ends it
    assert await asyncio.wait_for(reading, 10) == expected
    prompts = [
        r["body"]["prompt"]
        for r in west.requests
        if r["path"] == COMPLETIONS and not r["refused"]  # a 503 while held is not a send
    ]
    assert [len(p) for p in prompts] == [7 + 20, 7 + 35]  # never an id twice, never one lost


async def test_past_the_bound_on_continuations_the_stream_ends_cut(
    haru, doubles, fleet, hold_settings
):
    hold_settings(chat_continue_max=1)
    doubles["east"].cut_after, doubles["west"].cut_after = 20, 10
    doubles["west"].delay = 0.01  # cut after its seam was read
    before = failures("too_many_cuts")
    reading = asyncio.create_task(read_all(haru, "chat", body("chat", stream=True, max_tokens=60)))
    await until_held(1)
    await sync_to_async(promote)(fleet, "west")
    with pytest.raises(httpx.RemoteProtocolError):
        await asyncio.wait_for(reading, 10)
    assert failures("too_many_cuts") == before + 1


async def test_a_stream_over_the_bound_is_not_continued(haru, doubles, fleet, hold_settings):
    hold_settings(chat_continue_max_ids=40)  # the prompt (21) and 19 answer ids
    request = body("chat", stream=True, max_tokens=60)
    doubles["east"].cut_after = 30
    before = failures("over_bound")
    with pytest.raises(httpx.RemoteProtocolError):
        await read_all(haru, "chat", request)
    assert failures("over_bound") == before + 1
    assert doubles["west"].requests == []


async def test_a_client_that_asked_for_ids_gets_them_across_the_seam(
    haru, doubles, fleet, hold_settings
):
    request = body("completions", stream=True, max_tokens=40, return_token_ids=True)
    expected = await baseline(doubles["west"], "completions", request)
    doubles["east"].cut_after = 15
    assert await cut_then_promote(haru, fleet, "completions", request) == expected


async def test_a_non_streamed_request_cut_by_a_crash_is_run_again(
    haru, doubles, fleet, hold_settings
):
    cutter = Cutter(b"")  # takes the request, then drops the connection: it may have run
    server = await asyncio.start_server(cutter.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    await sync_to_async(ModelBinding.objects.filter(domain__slug="east").update)(
        serving_url=f"http://127.0.0.1:{port}"
    )
    try:
        answering = asyncio.create_task(haru.post(CHAT, json=body("chat", max_tokens=10)))
        await until_held(1)
    finally:
        server.close()
    await sync_to_async(promote)(fleet, "west")
    response = await asyncio.wait_for(answering, 10)
    assert response.status_code == 200
    assert response.json()["engine"] == "west"
    assert cutter.requests == 1


async def test_a_non_streamed_answer_a_sleep_aborted_is_run_again(
    haru, doubles, fleet, hold_settings
):
    doubles["east"].cut_after, doubles["east"].cut = 5, "abort"
    answering = asyncio.create_task(haru.post(CHAT, json=body("chat", max_tokens=10)))
    await until_held(1)
    await sync_to_async(promote)(fleet, "west")
    response = await asyncio.wait_for(answering, 10)
    assert response.status_code == 200
    assert response.json()["engine"] == "west"
    assert doubles["east"].cuts == 1


async def test_the_continuation_series_are_exported(haru, doubles, fleet, hold_settings):
    text = (await haru.get("/metrics")).text
    for name in (
        "haru_proxy_streams_continued_total",
        "haru_proxy_stream_continuation_failures_total",
        "haru_proxy_stream_seam_stall_seconds",
    ):
        assert f"# TYPE {name.removesuffix('_total')}" in text


async def test_a_stream_cut_after_routing_moved_reads_its_text_on_the_new_active_only(
    haru, doubles, fleet, hold_settings
):
    # A planned promotion switches routing before the old active sleeps and cuts the stream:
    # the text before the seam is read where the continuation goes, never on the old active.
    request = body("chat", stream=True, max_tokens=60)
    expected = await baseline(doubles["west"], "chat", request)
    east, west = doubles["east"], doubles["west"]
    east.cut_after, east.cut, east.delay = 40, "abort", 0.025  # a second to promote in
    reading = asyncio.create_task(read_all(haru, "chat", request))
    async with asyncio.timeout(10):
        while east.events_sent < 3:
            await asyncio.sleep(0.005)
    await sync_to_async(promote)(fleet, "west")
    # Another request reads the moved routing before the cut: the snapshot held at the cut
    # names west as the active and east as the other domain.
    assert (await haru.get("/v1/models")).status_code == 200
    assert not reading.done() and east.cuts == 0
    assert await asyncio.wait_for(reading, 10) == expected
    assert east.cuts == 1
    assert [r["path"] for r in east.requests].count("/detokenize") == 0
    assert [r["path"] for r in west.requests].count("/detokenize") == 2


def snapshot_now(fleet) -> snapshots.Snapshot:
    rows = store.snapshot_rows_read(str(fleet.id))
    assert rows is not None
    return snapshots.snapshot_build(rows, 0.0)


async def test_the_snapshot_names_each_models_standby_binding_as_its_spare(doubles, fleet):
    def check() -> None:
        snapshot = snapshot_now(fleet)
        west = ModelBinding.objects.filter(domain__fleet=fleet, domain__slug="west")
        assert snapshot.routes and set(snapshot.spares) == set(snapshot.routes)
        for name, spare in snapshot.spares.items():
            binding = west.get(name=name)
            assert spare.domain_id == str(binding.slot.domain_id) and spare.continues
            target = spare.targets["detokenize"]
            assert target.port == urlsplit(doubles["west"].url).port
            assert target.path.endswith(b"/detokenize")
            assert snapshot.routes[name].targets["detokenize"] != target  # the active's own

    await sync_to_async(check)()


async def test_a_standby_binding_that_cannot_serve_as_a_spare_never_stops_routing(doubles, fleet):
    def check() -> None:
        west = ModelBinding.objects.filter(domain__fleet=fleet, domain__slug="west")
        routes = set(snapshot_now(fleet).routes)
        name = sorted(routes)[0]
        west.filter(name=name).update(serving_url="ftp://nowhere/v1")  # malformed: skipped
        snapshot = snapshot_now(fleet)
        assert set(snapshot.routes) == routes and name not in snapshot.spares
        west.update(profile={"engine": "sglang"})  # an engine that cannot continue: none
        snapshot = snapshot_now(fleet)
        assert snapshot.spares == {} and set(snapshot.routes) == routes

    await sync_to_async(check)()


async def test_a_burst_of_continuations_is_sent_stalest_first():
    order = continuation.SeamOrder()
    released: list[float] = []

    async def one(last_chunk_at: float) -> None:
        await order.turn(last_chunk_at)
        released.append(last_chunk_at)

    # Ready in the same turn of the loop, in any order: the client waiting longest goes first.
    await asyncio.gather(*(one(at) for at in (3.0, 1.0, 2.0, 0.5)))
    assert released == [0.5, 1.0, 2.0, 3.0]
    # One alone passes at once; one whose client left while it waited holds nobody up.
    await asyncio.wait_for(one(9.0), 1)
    left = asyncio.ensure_future(order.turn(0.1))
    others = [asyncio.ensure_future(one(at)) for at in (5.0, 4.0)]
    await asyncio.sleep(0)
    left.cancel()
    await asyncio.wait_for(asyncio.gather(*others), 1)
    assert released[-2:] == [4.0, 5.0]


async def test_a_continuation_takes_its_turn_by_its_clients_last_chunk(
    haru, doubles, fleet, hold_settings, monkeypatch
):
    turns: list[float] = []

    class Recorded(continuation.SeamOrder):
        async def turn(self, last_at: float) -> None:
            turns.append(last_at)
            await super().turn(last_at)

    recorded = Recorded()
    monkeypatch.setattr(continuation, "seam_order", lambda loop: recorded)
    request = body("chat", stream=True, max_tokens=80)
    expected = await baseline(doubles["west"], "chat", request)
    doubles["east"].cut_after = 30
    started = time.monotonic()

    got = await cut_then_promote(haru, fleet, "chat", request)

    assert got == expected
    # Each attempt (refused while east is down, then sent to west) took its turn keyed by when
    # the client's last chunk before the cut came, not by when the attempt was made.
    assert len(turns) >= 2 and len(set(turns)) == 1
    assert started < turns[0] < time.monotonic()
