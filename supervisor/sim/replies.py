"""OpenAI-shaped bodies for the simulated engine: deterministic text, chunks and usage."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from common.strict_json import is_int

DEFAULT_MAX_TOKENS = 16


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Completion:
    """One request's answer, decided up front: tokens (words) and why generation ended."""

    request_id: str
    created: int
    model: str
    tokens: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    body_sha256: str
    body_bytes: int

    def cut(self, kept: int) -> Completion:
        """The same reply ended after `kept` tokens by an aborting sleep."""
        return replace(self, tokens=self.tokens[:kept], finish_reason="abort")

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.tokens),
            "total_tokens": self.prompt_tokens + len(self.tokens),
        }

    def trace(self) -> dict[str, Any]:
        # Lets a proxy test prove the exact request bytes arrived, from the reply alone.
        return {"requestSha256": self.body_sha256, "requestBytes": self.body_bytes}


def plan_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    body: bytes,
    payload: dict[str, Any],
    chat: bool,
    reply: str,
    echo: bool,
) -> Completion:
    """Decide the reply: the configured text, or in echo mode the last user input."""
    prompt_text = _prompt_text(payload, chat)
    source = (prompt_text or "(empty)") if echo else reply
    words = source.split()
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if not is_int(limit) or limit < 1:
        limit = DEFAULT_MAX_TOKENS
    kept = words[:limit]
    tokens = tuple(w if i == 0 else " " + w for i, w in enumerate(kept))
    return Completion(
        request_id=request_id,
        created=created,
        model=model,
        tokens=tokens,
        finish_reason="length" if len(words) > limit else "stop",
        prompt_tokens=max(1, len(prompt_text.split())),
        body_sha256=hashlib.sha256(body).hexdigest(),
        body_bytes=len(body),
    )


def _prompt_text(payload: dict[str, Any], chat: bool) -> str:
    if not chat:
        prompt = payload.get("prompt", "")
        if isinstance(prompt, list):
            prompt = " ".join(p for p in prompt if isinstance(p, str))
        return prompt if isinstance(prompt, str) else ""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    p.get("text", "")
                    for p in content
                    if isinstance(p, dict) and p.get("type") == "text"
                )
    return ""


def chat_body(c: Completion) -> dict[str, Any]:
    message = {"role": "assistant", "content": c.text}
    reply = _reply(c, "chat.completion", [_choice({"message": message}, c.finish_reason)])
    return {**reply, "usage": c.usage(), "haru_sim": c.trace()}


def completion_body(c: Completion) -> dict[str, Any]:
    reply = _reply(c, "text_completion", [_choice({"text": c.text}, c.finish_reason)])
    return {**reply, "usage": c.usage(), "haru_sim": c.trace()}


def chat_chunk(c: Completion, delta: dict[str, Any], finish: str | None) -> bytes:
    return sse(_reply(c, "chat.completion.chunk", [_choice({"delta": delta}, finish)]))


def completion_chunk(c: Completion, text: str, finish: str | None) -> bytes:
    return sse(_reply(c, "text_completion", [_choice({"text": text}, finish)]))


def usage_chunk(c: Completion, chat: bool) -> bytes:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return sse({**_reply(c, kind, []), "usage": c.usage()})


def _reply(c: Completion, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every OpenAI reply and chunk starts with, in the order vLLM writes them."""
    return {
        "id": c.request_id,
        "object": kind,
        "created": c.created,
        "model": c.model,
        "choices": choices,
    }


def _choice(content: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {"index": 0, **content, "logprobs": None, "finish_reason": finish}


def sse(value: Any) -> bytes:
    return b"data: " + dumps(value) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def openai_error(message: str, kind: str, code: int, *, param: str | None = None) -> bytes:
    """Render an error the way vLLM does (not the supervisor envelope)."""
    return dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})
