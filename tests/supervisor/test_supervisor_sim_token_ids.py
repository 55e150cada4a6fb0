"""The simulated engine's token ids over HTTP, in vLLM 0.32's shapes, and a stream continued on
a second engine process from every cut point, byte for byte."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

pytestmark = pytest.mark.integration

MODEL = "qwen-small"
ANSWER_TOKENS = 200

# vLLM 0.32's field order (entrypoints/openai/{chat_completion,completion}/protocol.py, dumped
# with exclude_unset as its serving code does) for the fields the sim writes.
CHAT_FIRST_CHUNK = [
    "id",
    "object",
    "created",
    "model",
    "choices",
    "prompt_token_ids",
    "prompt_text",
]
CHAT_CHOICE = ["index", "delta", "logprobs", "finish_reason", "token_ids"]
CHAT_FINISH_CHOICE = ["index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"]
COMPLETION_CHOICE = [
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "prompt_token_ids",
    "token_ids",
]


@pytest.fixture(scope="module")
def engines(module_processes, tools):
    """Two engines serving the same model, as the active and the standby would."""
    return [tools.start_sim(module_processes, MODEL, "--generate") for _ in range(2)]


@pytest.fixture(scope="module")
def quirky(module_processes, tools):
    return tools.start_sim(module_processes, MODEL, "--generate", "--reemit-split-prompt")


def sse(body: str) -> list:
    events = []
    for block in body.split("\n\n"):
        if block.strip():
            payload = block.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def chat(**extra) -> dict:
    content = "Tell me a long story, s'il vous plaît."
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30, trust_env=False)


def test_ids_round_trip_through_tokenize_and_detokenize(engines):
    url = engines[0].url
    text = "café 日本 🙂 and the stream"
    tokenized = post(url, "/tokenize", {"model": MODEL, "prompt": text}).json()
    assert list(tokenized) == ["count", "max_model_len", "tokens", "token_strs"]
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["token_strs"] is None
    assert post(url, "/detokenize", {"model": MODEL, "tokens": tokenized["tokens"]}).json() == {
        "prompt": text
    }
    # The chat form gives the ids the chat endpoint reports as its prompt's.
    templated = post(url, "/tokenize", {"model": MODEL, "messages": chat()["messages"]}).json()
    streamed = sse(post(url, "/v1/chat/completions", chat(stream=True, return_token_ids=True)).text)
    assert templated["tokens"] == streamed[0]["prompt_token_ids"]


def test_tokenize_and_detokenize_refuse_bad_input_in_vllms_envelope(engines):
    url = engines[0].url
    bad = post(url, "/detokenize", {"tokens": [5, 10**9]})
    assert bad.status_code == 400 and "out of vocabulary" in bad.json()["error"]["message"]
    assert list(bad.json()["error"]) == ["message", "type", "param", "code"]
    # /detokenize is served outside Starlette (a seam's burst asks it): the same refusals.
    assert post(url, "/detokenize", {"model": "gpt-4", "tokens": [5]}).status_code == 404
    assert post(url, "/detokenize", {"model": MODEL, "tokens": "5"}).status_code == 400
    raw = httpx.post(f"{url}/detokenize", content=b"{", timeout=30, trust_env=False)
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "BadRequestError"
    assert httpx.get(f"{url}/detokenize", timeout=30, trust_env=False).status_code == 405
    assert httpx.get(f"{url}/v1/completions", timeout=30, trust_env=False).status_code == 405
    assert post(url, "/tokenize", {"model": "gpt-4", "prompt": "x"}).status_code == 404
    assert post(url, "/tokenize", {"prompt": 3}).status_code == 400


def test_streamed_chat_carries_ids_in_vllms_places(engines):
    body = chat(stream=True, return_token_ids=True, max_tokens=40)
    events = sse(post(engines[0].url, "/v1/chat/completions", body).text)
    assert events[-1] == "[DONE]"
    first, *tokens_, last = events[:-1]
    assert list(first) == CHAT_FIRST_CHUNK and first["prompt_text"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(list(e["choices"][0]) == CHAT_CHOICE for e in tokens_)
    assert list(last["choices"][0]) == CHAT_FINISH_CHOICE
    assert last["choices"][0]["finish_reason"] == "length"
    chunks = [*tokens_, last]
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in chunks)
    assert len({e["id"] for e in events[:-1]}) == 1
    # Bytes of a character not yet complete are held back: their chunks carry only ids.
    assert any(e["choices"][0]["delta"]["content"] == "" for e in chunks)


def test_non_streamed_replies_carry_the_same_ids(engines):
    url = engines[0].url
    streamed = sse(post(url, "/v1/chat/completions", chat(stream=True, return_token_ids=True)).text)
    ids = [i for e in streamed[1:-1] for i in e["choices"][0]["token_ids"]]
    whole = post(url, "/v1/chat/completions", chat(return_token_ids=True)).json()
    assert whole["prompt_token_ids"] == streamed[0]["prompt_token_ids"]
    assert whole["choices"][0]["token_ids"] == ids
    assert whole["usage"]["completion_tokens"] == len(ids) == 16  # the default bound
    text = "".join(e["choices"][0]["delta"]["content"] for e in streamed[1:-1])
    assert whole["choices"][0]["message"]["content"] == text
    plain = post(url, "/v1/chat/completions", chat()).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
    assert plain["choices"][0]["message"]["content"] == text


def test_streamed_completions_carry_the_prompt_ids_on_the_first_chunk(engines):
    body = {"model": MODEL, "prompt": "the proxy", "stream": True, "return_token_ids": True}
    body["stream_options"] = {"include_usage": True}
    events = sse(post(engines[0].url, "/v1/completions", body).text)
    chunks = [e for e in events[:-1] if e["choices"]]
    assert all(list(e["choices"][0]) == COMPLETION_CHOICE for e in chunks)
    assert (
        chunks[0]["choices"][0]["prompt_token_ids"]
        == post(engines[0].url, "/tokenize", {"prompt": "the proxy"}).json()["tokens"]
    )
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in chunks[1:])
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == sum(len(e["choices"][0]["token_ids"]) for e in chunks)


def _uninterrupted(url: str) -> tuple[list[int], list[int], str]:
    body = chat(stream=True, return_token_ids=True, max_tokens=ANSWER_TOKENS)
    events = sse(post(url, "/v1/chat/completions", body).text)
    ids = [i for e in events[1:-1] for i in e["choices"][0]["token_ids"]]
    text = "".join(e["choices"][0]["delta"]["content"] for e in events[1:-1])
    return events[0]["prompt_token_ids"], ids, text


def test_a_stream_continues_from_every_cut_point_on_another_engine(engines):
    """What the proxy does after a cut: ask the other engine's completions endpoint for the rest,
    with the prompt's ids plus the ids sent, and rebuild the text from the ids."""
    prompt, ids, text = _uninterrupted(engines[0].url)
    assert len(ids) == ANSWER_TOKENS
    standby = engines[1].url
    with httpx.Client(base_url=standby, timeout=30, trust_env=False) as client:
        for k in range(ANSWER_TOKENS):
            body = {
                "model": MODEL,
                "prompt": prompt + ids[:k],
                "max_tokens": ANSWER_TOKENS - k,
                "stream": True,
                "return_token_ids": True,
            }
            events = sse(client.post("/v1/completions", json=body).text)
            rest = [i for e in events[:-1] for i in e["choices"][0]["token_ids"]]
            assert rest == ids[k:], f"cut after {k} tokens"
            assert events[-2]["choices"][0]["finish_reason"] == "length"
            rebuilt = client.post("/detokenize", json={"tokens": ids[:k] + rest}).json()
            assert rebuilt["prompt"] == text, f"cut after {k} tokens"


def test_the_quirk_option_re_emits_earlier_text_at_a_seam_inside_a_character(engines, quirky):
    prompt, ids, text = _uninterrupted(engines[0].url)
    # The first cut point inside a character: its text so far ends in U+FFFD.
    k, head = next(
        (k, head)
        for k in range(1, ANSWER_TOKENS)
        if (
            head := post(engines[0].url, "/detokenize", {"tokens": ids[:k]}).json()["prompt"]
        ).endswith("\ufffd")
    )
    body = {"model": MODEL, "prompt": prompt + ids[:k], "max_tokens": 5, "stream": True}
    quirk = sse(post(quirky.url, "/v1/completions", {**body, "return_token_ids": True}).text)
    first = next(e["choices"][0]["text"] for e in quirk[:-1] if e["choices"][0]["text"])
    assert first.startswith("Tell me a long story") and head.rstrip("\ufffd") in first
    plain = sse(post(engines[1].url, "/v1/completions", body).text)
    joined = head.rstrip("\ufffd") + "".join(e["choices"][0]["text"] for e in plain[:-1])
    assert text.startswith(joined)


def test_a_scripted_reply_continues_on_another_engine_too(module_processes, tools):
    reply = "Grüße aus dem simulated Server: one two three four five six seven"
    a, b = (tools.start_sim(module_processes, "scripted", "--reply", reply) for _ in range(2))
    body = {"model": "scripted", "messages": [{"role": "user", "content": "x"}]}
    whole = post(a.url, "/v1/chat/completions", {**body, "return_token_ids": True}).json()
    ids = whole["choices"][0]["token_ids"]
    assert whole["choices"][0]["message"]["content"] == reply
    assert len(ids) == len(reply.split())  # each scripted word is one token, as before ids
    for k in range(len(ids)):
        rest = post(
            b.url,
            "/v1/completions",
            {"model": "scripted", "prompt": whole["prompt_token_ids"] + ids[:k]}
            | {"return_token_ids": True, "max_tokens": len(ids) - k},
        ).json()
        assert rest["choices"][0]["token_ids"] == ids[k:]
        assert rest["choices"][0]["finish_reason"] == "stop"


def test_an_aborting_sleep_ends_a_generated_stream_with_abort(module_processes, tools):
    slow = tools.start_sim(module_processes, MODEL, "--generate", "--token-delay-ms", "20")
    events: list = []

    def read() -> None:
        body = chat(stream=True, return_token_ids=True, max_tokens=ANSWER_TOKENS)
        events.extend(sse(post(slow.url, "/v1/chat/completions", body).text))

    reader = threading.Thread(target=read)
    reader.start()
    tools.wait_for(lambda: httpx.get(f"{slow.url}/_sim/stats").json()["inflight"] == 1)
    assert httpx.post(f"{slow.url}/sleep?level=1", timeout=10).status_code == 200
    reader.join(10)
    last = events[-2]["choices"][0]
    assert (last["finish_reason"], last["token_ids"], last["delta"]) == (
        "abort",
        [],
        {"content": ""},
    )
    sent = [i for e in events[1:-2] for i in e["choices"][0]["token_ids"]]
    assert 0 < len(sent) < ANSWER_TOKENS
    assert all(e["choices"][0]["finish_reason"] is None for e in events[1:-2])
