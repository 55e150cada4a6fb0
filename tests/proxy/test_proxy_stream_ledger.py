"""The stream ledger: ids kept and stripped on the hot path, the client's bytes unchanged."""

from __future__ import annotations

import pytest

from fleets.proxy import stream_ledger
from fleets.proxy.stream_ledger import Ledger
from tests.proxy.vllm_double import ANSWER_IDS, EOS, VllmDouble, prompt_ids_of_request


def stream(
    endpoint: str, *, ids: bool, usage: bool = False, limit: int = 40, wire="vllm", **script
) -> bytes:
    double = VllmDouble("east")
    double.wire = wire
    for key, value in script.items():
        setattr(double, key, value)
    chat = endpoint == "chat"
    doc = {"model": "qwen-small", "stream": True, "return_token_ids": ids}
    if usage:
        doc["stream_options"] = {"include_usage": True}
    answer = ANSWER_IDS[:limit]
    events = double._events(doc, chat, prompt_ids_of_request(chat), answer, "length", 0)
    return b"".join(e for e in events if e is not None)


def ledger(endpoint: str, *, strip: bool = True, limit: int = 10_000, wire="vllm") -> Ledger:
    return Ledger(endpoint, strip=strip, limit=limit, total_limit=10_000_000, nulls=wire == "vllm")


def feed_in_pieces(kept: Ledger, data: bytes, size: int) -> bytes:
    return b"".join(kept.feed(data[i : i + size]) for i in range(0, len(data), size))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("size", [1 << 20, 7, 1])
@pytest.mark.parametrize("wire", ["vllm", "sim"])
def test_the_client_gets_the_stream_it_would_get_without_ids(endpoint, usage, size, wire):
    with_ids = stream(endpoint, ids=True, usage=usage, wire=wire)
    without = stream(endpoint, ids=False, usage=usage, wire=wire)
    assert b'token_ids":[' in with_ids
    kept = ledger(endpoint, wire=wire)
    assert feed_in_pieces(kept, with_ids, size) == without
    assert kept.done and kept.finish == b"length" and not kept.aborted


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_prompt_and_every_forwarded_id_are_kept(endpoint):
    kept = ledger(endpoint)
    kept.feed(stream(endpoint, ids=True, limit=30))
    assert kept.prompt() == prompt_ids_of_request(endpoint == "chat")
    assert kept.answer_ids() == ANSWER_IDS[:30]
    assert kept.count == len(kept.prompt()) + 30


def test_a_client_that_asked_for_ids_gets_them_untouched():
    with_ids = stream("chat", ids=True)
    kept = ledger("chat", strip=False)
    assert kept.feed(with_ids) == with_ids
    assert kept.answer_ids() == ANSWER_IDS[:40]


def test_an_abort_is_a_cut_and_nothing_of_it_reaches_the_client():
    data = stream("chat", ids=True, cut_after=12, cut="abort")
    kept = ledger("chat")
    out = kept.feed(data)
    assert kept.aborted and not kept.done and kept.finish is None
    assert b"abort" not in out and b"[DONE]" not in out
    assert kept.answer_ids() == ANSWER_IDS[:12]


def test_an_eof_before_the_end_leaves_the_stream_unfinished():
    kept = ledger("completions")
    kept.feed(stream("completions", ids=True, cut_after=9, cut="eof"))
    assert not kept.done and kept.finish is None
    assert kept.answer_ids() == ANSWER_IDS[:9]


def test_a_partial_event_waits_for_its_end():
    kept = ledger("chat")
    data = stream("chat", ids=True)
    cut = data.index(b"\n\n") + 10
    first = kept.feed(data[:cut])
    assert first.endswith(b"\n\n") and first.count(b"\n\n") == 1
    assert kept.feed(data[cut:]) == stream("chat", ids=False)[len(first) :]


def test_a_stream_over_the_bound_stops_being_kept_but_is_still_stripped():
    before = stream_ledger.kept_total()
    kept = ledger("chat", limit=30)  # the prompt is 21 ids: 10 answer ids pass the bound
    assert kept.feed(stream("chat", ids=True)) == stream("chat", ids=False)
    assert kept.reason == "over_bound"
    assert kept.answer_ids() == [] and kept.count == 0
    assert stream_ledger.kept_total() == before


def test_the_process_bound_stops_the_stream_that_would_pass_it():
    before = stream_ledger.kept_total()
    first = Ledger("chat", strip=True, limit=10_000, total_limit=before + 50)
    first.feed(stream("chat", ids=True, limit=20))
    second = Ledger("chat", strip=True, limit=10_000, total_limit=before + 50)
    second.feed(stream("chat", ids=True, limit=20))
    assert first.reason is None and second.reason == "over_process_bound"
    first.release()
    assert stream_ledger.kept_total() == before


def test_tool_calls_make_a_chat_stream_not_continuable():
    kept = ledger("chat")
    event = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},'
        b'"logprobs":null,"finish_reason":null,"token_ids":[5]}]}\n\n'
    )
    assert b"[5]" not in kept.feed(event)
    assert kept.reason == "parsed"


def test_the_end_of_sequence_id_is_kept_with_the_finish():
    kept = ledger("chat")
    double = VllmDouble("east")
    doc = {"model": "m", "stream": True, "return_token_ids": True}
    events = double._events(
        doc, True, prompt_ids_of_request(True), [*ANSWER_IDS[:3], EOS], "stop", 0
    )
    kept.feed(b"".join(events))
    assert kept.finish == b"stop" and kept.answer_ids()[-1] == EOS
