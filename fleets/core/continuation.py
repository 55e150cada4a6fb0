"""Stream continuation's rules: which streams can continue, what the continuation asks, and how
its text is stitched to what the client already has (docs/proxy-hold.md, "Streams cut after
their headers").

A stream cut after its headers (the engine died, a sleep aborted it) is continued on the domain
routing commits to next: the engine is asked, on its completions endpoint, for the rest of the
answer with the prompt's token ids plus the ids already sent as its prompt. Everything here is
pure: the proxy's flow (fleets/proxy/continuation.py) does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Request = dict[str, Any]  # a request body as JSON parsed it

# The engines whose servers return token ids (`return_token_ids`) and take a prompt of ids on
# /v1/completions, with /detokenize: vLLM and Haru's simulated engine, which speaks its shapes.
CONTINUING_ENGINES = frozenset({"vllm", "sim"})

# Sampling and stop parameters a continuation carries over unchanged (both endpoints accept
# them on vLLM). Anything else of the original request is left out: the prompt is ids now.
CARRIED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stop",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "bad_words",
    "allowed_token_ids",
    "user",
)
# Request fields that make the rest of an answer depend on more than the ids so far: a grammar
# restarted from the beginning, or parsers that only the chat endpoint runs.
_STRUCTURED = ("response_format", "structured_outputs", "guided_json", "guided_regex",
               "guided_choice", "guided_grammar", "guided_decoding_backend")  # fmt: skip
REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character not yet complete


def engine_continues(engine: str | None) -> bool:
    """Whether a binding's engine can continue a stream cut elsewhere."""
    return (engine or "") in CONTINUING_ENGINES


def refusal(document: Request, endpoint: str) -> str | None:
    """Why a streamed request cannot be continued after a cut (it then ends as today), or None.

    The reason is a metric label: n, logprobs, tools, structured, echo, usage_per_chunk.
    """
    if _number(document.get("n"), 1) != 1 or _number(document.get("best_of"), 1) != 1:
        return "n"  # several choices interleave in one stream
    if endpoint == "completions":
        prompt = document.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return "n"  # a list of prompts: one choice per prompt
        if document.get("echo"):
            return "echo"
        if document.get("logprobs") is not None:
            return "logprobs"
        if document.get("suffix"):
            return "structured"
    else:
        if document.get("logprobs") or document.get("top_logprobs"):
            return "logprobs"
        tools = document.get("tools") or document.get("functions")
        if tools and document.get("tool_choice") != "none":
            # A tool call is parsed by the chat endpoint only: continued through completions
            # it would reach the client as plain text.
            return "tools"
    if any(document.get(key) is not None for key in _STRUCTURED):
        return "structured"
    options = document.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        return "usage_per_chunk"
    return None


def wants_usage(document: Request) -> bool:
    """Whether the client asked for the usage chunk at the end of the stream."""
    options = document.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def token_limit(document: Request, endpoint: str) -> int | None:
    """The request's bound on generated tokens, None when it sets none."""
    keys = ("max_completion_tokens", "max_tokens") if endpoint == "chat" else ("max_tokens",)
    for key in keys:
        value = document.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def stops_of(document: Request) -> tuple[str, ...]:
    stop = document.get("stop")
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str) and s)
    return ()


def holdback(document: Request) -> int:
    """How many characters vLLM holds back while streaming, to cut a stop string it may yet
    complete (its detokenizer's stop buffer)."""
    stops = stops_of(document)
    if not stops or document.get("include_stop_str_in_output"):
        return 0
    return max(len(s) for s in stops) - 1


def continuation_request(
    document: Request, endpoint: str, model: str, ids: list[int], generated: int
) -> Request | None:
    """The completions request that asks for the rest of the answer, or None when nothing is
    left to generate (the limit is reached: the answer ends with finish_reason "length").

    `ids` are the prompt's ids followed by the `generated` ids already sent to the client.
    """
    body: Request = {
        "model": model,
        "prompt": ids,
        "stream": True,
        "return_token_ids": True,
    }
    limit = token_limit(document, endpoint)
    if limit is not None:
        left = limit - generated
        if left <= 0:
            return None
        body["max_tokens"] = left
    minimum = document.get("min_tokens")
    if isinstance(minimum, int) and minimum - generated > 0:
        body["min_tokens"] = minimum - generated
    for key in CARRIED:
        if key in document:
            body[key] = document[key]
    if wants_usage(document):
        # Its usage is not the answer's, but its key order is the engine's own: the proxy
        # writes the whole answer's figures in it.
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass(frozen=True)
class StopHit:
    keep: int  # characters of the new text the client still gets
    stop: str  # the stop string matched (vLLM's `stop_reason`)


def stop_across_seam(
    before: str, new: str, stops: tuple[str, ...], include: bool
) -> StopHit | None:
    """Find the first stop string in the text just after a seam, `before` being the end of
    what the client has.

    The continuing engine saw neither `before` nor the text the first engine held back as
    text, so a stop that starts there and ends in `new` is the proxy's to find (one wholly in
    the engine's own text is found alike, as the engine would). The earliest match wins.
    """
    best: StopHit | None = None
    best_end = -1
    for stop in stops:
        tail = before[-(len(stop) - 1) :] if len(stop) > 1 else ""
        at = (tail + new).find(stop)
        if at == -1:
            continue
        end = at + len(stop)
        if best is None or end < best_end:
            keep = end - len(tail) if include else max(at - len(tail), 0)
            best, best_end = StopHit(keep=keep, stop=stop), end
    return best


def settled_end(decoded: str, finished: bool, held: int) -> int:
    """How far into `decoded` (an answer's ids, detokenized) the engine has sent the text:
    never a character still incomplete (the replacement character a decoder shows for it)
    and, until the end, never the last `held` characters (a stop string may yet complete
    there). vLLM's detokenizer does exactly this, so at a cut it is also where the text the
    client has ends: the proxy need not keep the text itself."""
    end = len(decoded.rstrip(REPLACEMENT))
    return end if finished else max(end - held, 0)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The usage of the whole answer, in vLLM's field order."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _number(value: object, default: int) -> object:
    return default if value is None else value
