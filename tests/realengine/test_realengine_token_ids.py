"""Token ids, one contract for two engines: a generating simulator and a real vLLM put
`return_token_ids`' fields in the same places, and take a prompt of ids alike.

What a stream continued across engines looks like on real vLLMs is the continuation tier's
(bench/failover_load.py); this file keeps the simulator's wire honest.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.realengine.conftest import MODEL, Served, free_port, stop, wait_healthy

pytestmark = pytest.mark.realengine


@pytest.fixture(scope="module")
def generating_sim(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("sim-ids") / "sim.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "supervisor.sim",
                "--port",
                str(port),
                "--model",
                MODEL,
                "--max-model-len",
                "512",
                "--generate",
            ],  # fmt: skip
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(f"http://127.0.0.1:{port}", port, proc, log)
    wait_healthy(served.url, proc, log, 30)
    yield served
    stop(proc)


@pytest.fixture(params=["sim", "vllm"])
def engine(request):
    served = (
        request.getfixturevalue("generating_sim")
        if request.param == "sim"
        else request.getfixturevalue("engines").plain
    )
    with httpx.Client(base_url=served.url, timeout=120, trust_env=False) as client:
        yield client


def events(response: httpx.Response) -> list:
    assert response.status_code == 200, response.text
    out = []
    for block in response.text.split("\n\n"):
        if block.strip():
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def chat(**extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "ignore_eos": True,  # the random model must not stop early
        "return_token_ids": True,
        **extra,
    }


def test_a_streamed_chat_carries_the_prompt_ids_first_and_an_id_per_chunk(engine):
    got = events(engine.post("/v1/chat/completions", json=chat(stream=True)))
    assert got[-1] == "[DONE]"
    first, *chunks = got[:-1]
    assert list(first) == [
        "id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text",
    ]  # fmt: skip
    assert isinstance(first["prompt_token_ids"], list) and first["prompt_token_ids"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "token_ids" not in first["choices"][0]
    assert all(
        list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        for c in chunks[:-1]
    )
    assert list(chunks[-1]["choices"][0]) == [
        "index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids",
    ]  # fmt: skip
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert len(ids) == 8


def test_a_whole_chat_carries_the_same_fields(engine):
    body = engine.post("/v1/chat/completions", json=chat()).json()
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert "prompt_text" in body
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] == 8
    assert "stop_reason" in choice


def test_completions_take_a_prompt_of_ids_and_return_them_on_the_first_chunk(engine):
    prompt = engine.post("/tokenize", json={"model": MODEL, "prompt": "the stream"}).json()
    assert list(prompt) == ["count", "max_model_len", "tokens", "token_strs"]
    body = {
        "model": MODEL,
        "prompt": prompt["tokens"],
        "max_tokens": 6,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    got = events(engine.post("/v1/completions", json=body))
    chunks = [e for e in got[:-1] if e["choices"]]
    keys = ["index", "text", "logprobs", "finish_reason", "stop_reason"]
    assert all(list(c["choices"][0]) == [*keys, "prompt_token_ids", "token_ids"] for c in chunks)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt["tokens"]
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert got[-2]["usage"]["completion_tokens"] == len(ids) == 6
    assert got[-2]["usage"]["prompt_tokens"] == prompt["count"]
    text = engine.post("/detokenize", json={"model": MODEL, "tokens": prompt["tokens"]}).json()
    assert list(text) == ["prompt"] and text["prompt"].endswith("the stream")


def test_an_id_outside_the_vocabulary_is_a_400(engine):
    body = {"model": MODEL, "prompt": [10**9], "max_tokens": 2}
    response = engine.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 400
