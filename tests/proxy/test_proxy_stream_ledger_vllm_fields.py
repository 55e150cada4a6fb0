"""The ledger on a chat stream's first chunk exactly as vLLM 0.32 writes it when asked for ids:
`prompt_token_ids`, then `prompt_text`, which is null unless `return_prompt_text` was asked."""

from __future__ import annotations

import json

import pytest

from fleets.proxy.stream_ledger import Ledger

HEAD = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}]'
)
WITHOUT_IDS = HEAD + b"}\n\n"


@pytest.mark.parametrize("prompt_text", [b"null", b'"<|user|>hi \\"there\\"<|end|>"'])
def test_the_first_chat_chunk_reaches_the_client_whole_without_the_prompts_fields(prompt_text):
    first = HEAD + b',"prompt_token_ids":[2,88,121],"prompt_text":' + prompt_text + b"}\n\n"
    kept = Ledger("chat", strip=True, limit=1000, total_limit=1_000_000)
    out = kept.feed(first)
    assert out == WITHOUT_IDS
    json.loads(out[len(b"data: ") :])  # still one JSON object: the SDK parses it
    assert kept.prompt() == [2, 88, 121]
    kept.release()
