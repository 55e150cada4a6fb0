"""What a client saw of one streamed answer, and how it differs from an uninterrupted one.

The proofs of stream continuation (bench/failover_streams.py, the end-to-end and real-engine
tests) read every stream through this one module, so they count a seam's faults the same way:
a second `id` or `created`, a second role chunk, no or two `finish_reason`s, no or two
`[DONE]`s, usage twice, token-id fields a client did not ask for, and text or ids that differ
from the baseline's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# The fields vLLM adds when asked for token ids (`return_token_ids`): a client that did not ask
# must never see them.
ID_FIELDS = ("token_ids", "prompt_token_ids", "prompt_text")


@dataclass
class StreamSeen:
    """One stream as its client received it."""

    ids: list[str] = field(default_factory=list)  # every distinct `id`, in order
    created: list[int] = field(default_factory=list)  # every distinct `created`, in order
    role_chunks: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    usages: list[dict[str, Any]] = field(default_factory=list)
    # `[DONE]` lines seen; None where the reader cannot see them (the OpenAI SDK consumes it).
    done: int | None = None
    text: str = ""
    # The answer's token ids, where the client asked for them (`return_token_ids`).
    token_ids: list[int] = field(default_factory=list)
    id_fields: int = 0  # chunks carrying any of ID_FIELDS
    chunks: int = 0
    error: str = ""  # what ended the stream early, as the client saw it

    @property
    def finished(self) -> bool:
        return not self.error and len(self.finish_reasons) == 1


def parse_sse(body: bytes) -> tuple[list[dict[str, Any]], int]:
    """Return the JSON events of an SSE body and how many `[DONE]` lines it held."""
    events: list[dict[str, Any]] = []
    done = 0
    for line in body.decode("utf-8").split("\n"):
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done += 1
        elif data:
            events.append(json.loads(data))
    return events, done


def read_events(events: Iterable[dict[str, Any]], *, done: int | None = None) -> StreamSeen:
    """Fold a stream's events (chat or completion chunks) into what its client saw."""
    seen = StreamSeen(done=done)
    for event in events:
        seen.chunks += 1
        if event.get("id") is not None and event["id"] not in seen.ids:
            seen.ids.append(event["id"])
        if event.get("created") is not None and event["created"] not in seen.created:
            seen.created.append(event["created"])
        if event.get("usage"):
            seen.usages.append(event["usage"])
        carries_ids = any(event.get(k) is not None for k in ID_FIELDS)
        for choice in event.get("choices") or []:
            carries_ids = carries_ids or any(choice.get(k) is not None for k in ID_FIELDS)
            delta = choice.get("delta")
            if isinstance(delta, dict):  # chat
                if delta.get("role") is not None:
                    seen.role_chunks += 1
                seen.text += delta.get("content") or ""
            else:  # completions
                seen.text += choice.get("text") or ""
            seen.token_ids += choice.get("token_ids") or []
            if choice.get("finish_reason") is not None:
                seen.finish_reasons.append(choice["finish_reason"])
        seen.id_fields += carries_ids
    return seen


def faults(
    seen: StreamSeen, baseline: StreamSeen | None = None, *, chat: bool, asked_ids: bool
) -> list[str]:
    """Return every way `seen` is not one whole stream equal to `baseline` (empty: none)."""
    found = []
    if seen.error:
        found.append(f"ended early: {seen.error}")
    if len(seen.ids) != 1:
        found.append(f"{len(seen.ids)} ids {seen.ids[:3]}")
    if len(seen.created) != 1:
        found.append(f"{len(seen.created)} created values")
    if chat and seen.role_chunks != 1:
        found.append(f"{seen.role_chunks} role chunks")
    if len(seen.finish_reasons) != 1:
        found.append(f"finish reasons {seen.finish_reasons}")
    if len(seen.usages) > 1:
        found.append(f"usage {len(seen.usages)} times")
    if seen.done is not None and seen.done != 1:
        found.append(f"{seen.done} [DONE] lines")
    if not asked_ids and seen.id_fields:
        found.append(f"{seen.id_fields} chunks carry token-id fields the client did not ask for")
    generated = seen.usages[-1].get("completion_tokens") if seen.usages else None
    if asked_ids and generated is not None and len(seen.token_ids) != generated:
        found.append(f"{len(seen.token_ids)} token ids for {generated} completion tokens")
    if baseline is None:
        return found
    if seen.text != baseline.text:
        at = next(
            (i for i, (a, b) in enumerate(zip(seen.text, baseline.text, strict=False)) if a != b),
            min(len(seen.text), len(baseline.text)),
        )
        found.append(
            f"text differs at character {at} of {len(baseline.text)}: "
            f"{seen.text[at : at + 24]!r} instead of {baseline.text[at : at + 24]!r}"
        )
    if seen.finish_reasons[-1:] != baseline.finish_reasons[-1:]:
        found.append(f"finish reason {seen.finish_reasons} instead of {baseline.finish_reasons}")
    if seen.usages != baseline.usages:
        found.append(f"usage {seen.usages} instead of {baseline.usages}")
    if asked_ids and seen.token_ids != baseline.token_ids:
        found.append(ids_fault(seen.token_ids, baseline.token_ids))
    return found


def ids_fault(got: list[int], want: list[int]) -> str:
    """Say where token ids first differ: lost at the seam, repeated, or different."""
    at = next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )
    if len(got) < len(want) and got[at:] == want[at + len(want) - len(got) :]:
        how = f"{len(want) - len(got)} lost"
    elif len(got) > len(want) and got[at + len(got) - len(want) :] == want[at:]:
        how = f"{len(got) - len(want)} repeated"
    else:
        how = "different"
    return f"token ids differ at {at} of {len(want)} ({how})"


def seam(times: list[float], cut_from: float, cut_to: float) -> tuple[float, float] | None:
    """Return the seam of a stream cut between `cut_from` and `cut_to` (a kill is not one
    instant: the processes die somewhere in it): the longest wait between two chunks that
    ends after `cut_from` and starts before `cut_to`, as (last chunk before, first after), or
    None when the stream had no chunk on either side."""
    gaps = [(a, b) for a, b in zip(times, times[1:], strict=False) if b >= cut_from and a <= cut_to]
    return max(gaps, key=lambda g: g[1] - g[0]) if gaps else None
