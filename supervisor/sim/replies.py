"""OpenAI-shaped bodies for the simulated engine: deterministic text, chunks and usage, and
vLLM's token id fields (`return_token_ids`) in the places vLLM puts them."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from common.strict_json import is_int
from supervisor.sim import tokens
from supervisor.sim.generate import Generator

DEFAULT_MAX_TOKENS = 16


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Step:
    """What one chunk carries: its text, its ids, and on a generated answer's last step why
    generation ended."""

    text: str
    ids: tuple[int, ...]
    finish: str | None = None
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class Completion:
    """One request's answer, decided up front: its steps (the text and the ids each chunk
    carries) and why generation ended.

    Two kinds: a scripted reply (the configured text or the echo, one word per step, as the
    simulator always answered) and a generated one (`--generate`, generate.py: one id per step,
    the finish reason on the last token's chunk as vLLM sends it). Either carries vLLM's token
    id fields when the request asked for them (`return_token_ids`).
    """

    request_id: str
    created: int
    model: str
    tokens: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    body_sha256: str
    body_bytes: int
    token_ids: tuple[tuple[int, ...], ...] = ()
    prompt_ids: tuple[int, ...] = ()
    stop_reason: str | int | None = None
    return_ids: bool = False
    generated: bool = False
    prompt_text: str | None = None
    # A generated answer's steps, produced as they are sent (None: `tokens` hold them all).
    source: Callable[[], Iterator[Step]] | None = None

    def steps(self) -> Iterator[Step]:
        """The answer's steps, in order: computed now for a generated answer."""
        if self.source is not None:
            yield from self.source()
            return
        for text, ids in zip(self.tokens, self.token_ids, strict=True):
            yield Step(text, ids)

    def settled(self, sent: list[Step]) -> Completion:
        """The answer as far as these steps went, the finish the last one carries."""
        last = sent[-1] if sent else None
        return replace(
            self,
            tokens=tuple(s.text for s in sent),
            token_ids=tuple(s.ids for s in sent),
            finish_reason=last.finish if last and last.finish else self.finish_reason,
            stop_reason=last.stop_reason if last and last.finish else self.stop_reason,
            source=None,
        )

    def whole(self) -> Completion:
        """The complete answer (a generated one, generated to its end)."""
        return self if self.source is None else self.settled(list(self.steps()))

    def cut(self, kept: int) -> Completion:
        """The same reply ended after `kept` steps by an aborting sleep."""
        return replace(
            self,
            tokens=self.tokens[:kept],
            token_ids=self.token_ids[:kept],
            finish_reason="abort",
            stop_reason=None,
        )

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def ids(self) -> list[int]:
        return [i for step in self.token_ids for i in step]

    def usage(self) -> dict[str, int]:
        if self.return_ids or self.generated:
            prompt, completion = len(self.prompt_ids), len(self.ids)
        else:
            prompt, completion = self.prompt_tokens, len(self.tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def trace(self) -> dict[str, Any]:
        # Lets a proxy test prove the exact request bytes arrived, from the reply alone.
        return {"requestSha256": self.body_sha256, "requestBytes": self.body_bytes}


class RequestError(ValueError):
    """A request the engine refuses with 400, in vLLM's words."""


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
    tokenizer: tokens.Tokenizer = tokens.BASE,
    generation: GenerationSettings | None = None,
) -> Completion:
    """Decide the reply: generated from the prompt's ids when `generation` is given, else the
    configured text or, in echo mode, the last user input. Raise RequestError for bad input."""
    return_ids = payload.get("return_token_ids") is True
    ids_prompt = _ids_prompt(payload, chat)
    # The plain scripted reply needs no ids: the chat proxy's benchmark upstream stays cheap.
    needs_ids = generation is not None or return_ids or ids_prompt
    prompt_ids = _prompt_ids(payload, chat, tokenizer) if needs_ids else []
    prompt_text = None
    if chat and payload.get("return_prompt_text") is True:
        prompt_text = tokenizer.decode(prompt_ids)
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    common: dict[str, Any] = {
        "request_id": request_id,
        "created": created,
        "model": model,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_bytes": len(body),
        "prompt_ids": tuple(prompt_ids),
        "return_ids": return_ids,
        "prompt_text": prompt_text,
    }
    if generation is not None:
        return _generate(payload, prompt_ids, limit, tokenizer, generation, common)
    prompt_words = _prompt_text(payload, chat, tokenizer)
    source = (prompt_words or "(empty)") if echo else reply
    words = source.split()
    steps = [w if i == 0 else " " + w for i, w in enumerate(words)]
    script = [tuple(tokenizer.encode(w)) if needs_ids else () for w in steps]
    done = 0
    if ids_prompt:
        # A prompt of ids may end with the start of the script (a continuation after a cut):
        # the engine goes on from there, as a model continues its context.
        script, done = _rest_of_script(script, prompt_ids)
    if not is_int(limit) or limit < 1:
        # As for a generated answer, the default bounds the whole reply (see _generate).
        limit = max(1, DEFAULT_MAX_TOKENS - done)
    kept = script[:limit]
    # After a cut inside a word, the first step is that word's rest: its text from its ids.
    texts = [tokenizer.decode(step) for step in kept] if ids_prompt else steps[:limit]
    return Completion(
        tokens=tuple(texts),
        token_ids=tuple(kept),
        finish_reason="length" if len(script) > limit else "stop",
        prompt_tokens=max(1, len(prompt_words.split())),
        **common,
    )


def _rest_of_script(
    script: list[tuple[int, ...]], context: list[int]
) -> tuple[list[tuple[int, ...]], int]:
    """The steps of `script` after the longest part of it that ends `context` (all of it
    when none does), the first one shortened when the context ends inside it; and how many
    whole steps that part held."""
    flat = [i for step in script for i in step]
    for done in range(min(len(flat), len(context)), 0, -1):
        if context[len(context) - done :] == flat[:done]:
            break
    else:
        return script, 0
    rest: list[tuple[int, ...]] = []
    at = whole = 0
    for step in script:
        if at + len(step) > done:
            rest.append(step[max(0, done - at) :])
        else:
            whole += 1
        at += len(step)
    return rest, whole


def _answered(prompt_ids: list[int]) -> int:
    """How many ids of an answer the prompt already ends with: those after its last
    `<|assistant|>` marker, when no `<|end|>` closed that turn."""
    assistant = tokens.ROLE_IDS["assistant"]
    if assistant not in prompt_ids:
        return 0
    tail = prompt_ids[len(prompt_ids) - prompt_ids[::-1].index(assistant) :]
    return 0 if tokens.END_ID in tail else len(tail)


@dataclass(frozen=True)
class GenerationSettings:
    """What a generating engine needs besides the request: its model's seed and options."""

    seed: int
    max_model_len: int
    eos_per_mille: int = 0
    # Emulate vLLM's seam quirk: a prompt ending inside a character makes the first chunk
    # carry the whole prompt's text again (see docs/supervisor.md).
    reemit_split_prompt: bool = False


def _generate(
    payload: dict[str, Any],
    prompt_ids: list[int],
    limit: Any,
    tokenizer: tokens.Tokenizer,
    settings: GenerationSettings,
    common: dict[str, Any],
) -> Completion:
    room = settings.max_model_len - len(prompt_ids)
    if limit is None:
        # The default bounds the whole answer, not each request: a continuation (whose prompt
        # carries the answer so far) without max_tokens ends where the original would have.
        limit = min(max(1, DEFAULT_MAX_TOKENS - _answered(prompt_ids)), room)
    if not is_int(limit) or limit < 1:
        raise RequestError("max_tokens must be at least 1")
    if limit > room:
        raise RequestError(
            f"This model's maximum context length is {settings.max_model_len} tokens. "
            f"However, you requested {limit} output tokens and your prompt contains "
            f"{len(prompt_ids)} input tokens, for a total of {limit + len(prompt_ids)} "
            f"tokens. Please reduce the length of the input prompt or the number of "
            f"requested output tokens."
        )
    # Generated as it is sent, not up front: a burst of continued streams arriving at once
    # then costs each its first token, not its whole answer, before the first chunk.
    steps = functools.partial(_generated_steps, payload, prompt_ids, limit, tokenizer, settings)
    return Completion(
        tokens=(),
        finish_reason="length",
        prompt_tokens=len(prompt_ids),
        generated=True,
        source=steps,
        **common,
    )


def _generated_steps(
    payload: dict[str, Any],
    prompt_ids: list[int],
    limit: int,
    tokenizer: tokens.Tokenizer,
    settings: GenerationSettings,
) -> Iterator[Step]:
    stops = _stop_strings(payload)
    stop_ids = _stop_token_ids(payload)
    keep_stop = payload.get("include_stop_str_in_output") is True
    ignore_eos = payload.get("ignore_eos") is True
    prompt_bytes = tokenizer.text_bytes(prompt_ids)
    tail = tokens.incomplete_tail(prompt_bytes)
    # The bytes of a character the prompt began are the decoder's start: the first chunk
    # completes it (or, with the quirk, carries the whole prompt's text again).
    pending = prompt_bytes if settings.reemit_split_prompt else prompt_bytes[-tail:]
    decoder = tokens.IncrementalDecoder(tokenizer, pending if tail else b"")
    generator = Generator(
        tokenizer, settings.seed, prompt_ids, eos_per_mille=settings.eos_per_mille
    )
    # Text may end in the start of a stop string: held back until it cannot be one, as vLLM.
    hold = max((len(s) for s in stops), default=1) - 1 if not keep_stop else 0
    text, sent = "", 0
    for count in range(1, limit + 1):
        token_id = generator.next_id(ignore_eos=ignore_eos)
        finish: str | None = "length" if count == limit else None
        stop_reason: str | int | None = None
        if token_id == tokens.EOS_ID or token_id in stop_ids:
            finish = "stop"
            stop_reason = None if token_id == tokens.EOS_ID else token_id
        else:
            before = len(text)
            text += decoder.push(token_id)
            found = _find_stop(text, stops, before)
            if found is not None:
                at, stop = found
                text = text[: at + len(stop)] if keep_stop else text[:at]
                finish, stop_reason = "stop", stop
        release = len(text) if finish else max(sent, len(text) - hold)
        yield Step(text[sent:release], (token_id,), finish, stop_reason)
        sent = release
        if finish:
            return


def _find_stop(text: str, stops: list[str], before: int) -> tuple[int, str] | None:
    """The first stop string that the text added after `before` completes."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, max(0, before - len(stop) + 1))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return best


def _stop_strings(payload: dict[str, Any]) -> list[str]:
    stop = payload.get("stop")
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def _stop_token_ids(payload: dict[str, Any]) -> set[int]:
    given = payload.get("stop_token_ids")
    return {i for i in given if is_int(i)} if isinstance(given, list) else set()


def _ids_prompt(payload: dict[str, Any], chat: bool) -> bool:
    """Whether a completion's prompt is given as token ids."""
    prompt = payload.get("prompt")
    return (
        not chat
        and isinstance(prompt, list)
        and bool(prompt)
        and all(type(p) is int for p in prompt)
    )


def _prompt_ids(payload: dict[str, Any], chat: bool, tokenizer: tokens.Tokenizer) -> list[int]:
    """The prompt's token ids: the chat template's, the prompt string's, or the ids given."""
    if chat:
        messages = payload.get("messages")
        return tokenizer.render_chat(messages if isinstance(messages, list) else [])
    prompt = payload.get("prompt", "")
    if _ids_prompt(payload, chat):
        bad = tokenizer.out_of_vocabulary(prompt)
        if bad is not None:
            raise RequestError(f"Token id {bad} is out of vocabulary")
        return list(prompt)
    if isinstance(prompt, list):
        prompt = " ".join(p for p in prompt if isinstance(p, str))
    return tokenizer.encode(prompt if isinstance(prompt, str) else "")


def _prompt_text(payload: dict[str, Any], chat: bool, tokenizer: tokens.Tokenizer) -> str:
    """The text an echoing engine answers with: the last user message's."""
    if _ids_prompt(payload, chat):
        return _last_user_text(payload["prompt"], tokenizer)
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
            return tokens.message_text(message.get("content"))
    return ""


def _last_user_text(ids: list[int], tokenizer: tokens.Tokenizer) -> str:
    """The last user message of a chat template's ids, or all their text when there is none."""
    user = tokens.ROLE_IDS["user"]
    if user in ids:
        start = len(ids) - ids[::-1].index(user)
        end = ids.index(tokens.END_ID, start) if tokens.END_ID in ids[start:] else len(ids)
        return tokenizer.decode(ids[start:end])
    return tokenizer.decode(ids, skip_special=True)


def chat_body(c: Completion) -> dict[str, Any]:
    message = {"role": "assistant", "content": c.text}
    choice = _choice({"message": message}, c.finish_reason)
    if c.return_ids:
        choice.update(stop_reason=c.stop_reason, token_ids=c.ids)
    reply = _reply(c, "chat.completion", [choice])
    reply["usage"] = c.usage()
    if c.return_ids:
        reply.update(prompt_token_ids=list(c.prompt_ids), prompt_text=c.prompt_text)
    return {**reply, "haru_sim": c.trace()}


def completion_body(c: Completion) -> dict[str, Any]:
    choice = _choice({"text": c.text}, c.finish_reason)
    if c.return_ids:
        choice.update(
            stop_reason=c.stop_reason, token_ids=c.ids, prompt_token_ids=list(c.prompt_ids)
        )
    reply = _reply(c, "text_completion", [choice])
    return {**reply, "usage": c.usage(), "haru_sim": c.trace()}


def chat_role_chunk(c: Completion) -> bytes:
    """The first chunk: the role, and with token ids asked for, the prompt's (vLLM's place)."""
    reply = _reply(
        c, "chat.completion.chunk", [_choice({"delta": {"role": "assistant", "content": ""}}, None)]
    )
    if c.return_ids:
        reply.update(prompt_token_ids=list(c.prompt_ids), prompt_text=c.prompt_text)
    return sse(reply)


def chat_chunk(
    c: Completion,
    delta: dict[str, Any],
    finish: str | None,
    ids: tuple[int, ...] = (),
    stop_reason: str | int | None = None,
) -> bytes:
    choice = _choice({"delta": delta}, finish)
    if c.return_ids:
        if finish is not None:
            choice["stop_reason"] = stop_reason
        choice["token_ids"] = list(ids)
    return sse(_reply(c, "chat.completion.chunk", [choice]))


def completion_chunk(
    c: Completion,
    text: str,
    finish: str | None,
    ids: tuple[int, ...] = (),
    stop_reason: str | int | None = None,
    *,
    first: bool = False,
) -> bytes:
    choice = _choice({"text": text}, finish)
    if c.return_ids:
        # vLLM's order: stop_reason, then the prompt's ids (first chunk only), then the ids.
        choice.update(
            stop_reason=stop_reason,
            prompt_token_ids=list(c.prompt_ids) if first else None,
            token_ids=list(ids),
        )
    return sse(_reply(c, "text_completion", [choice]))


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
