"""What the proxy keeps of a stream it may have to continue, and the stripping that hides it.

For a streamed request to an engine that can continue (fleets/core/continuation.py), the proxy
asks the engine for token ids in the same request (`return_token_ids`). The ledger reads each
server-sent event as it passes: it keeps the prompt's ids and the ids of every chunk it
forwards, with the raw text of that chunk, and removes the id fields (and chat chunks that
carry nothing but ids) so the client sees what it would have without them.

The healthy path pays for this on every chunk, so it works on bytes: vLLM serializes compactly
and in a fixed field order (pydantic's `model_dump_json`), so a few `bytes.find` calls locate
the fields, and JSON is parsed only on the rare chunk that needs it. The ids are kept as the
raw bytes between their brackets and parsed once, if ever, at a cut.

Bounds: HARU_CHAT_CONTINUE_MAX_IDS per stream and HARU_CHAT_CONTINUE_MAX_IDS_TOTAL per process;
a stream past either stops being kept (`reason` says why) and, if cut, ends as it did before.
"""

from __future__ import annotations

import json
import time

# Token ids kept right now by every ledger of this process (the per-process bound).
_kept = [0]

_IDS = b'"token_ids":['
_PROMPT_IDS = b'"prompt_token_ids":['
_PROMPT_TEXT = b',"prompt_text":'
_FINISH = b'"finish_reason":"'
_EMPTY_DELTA = b'"delta":{}'
_DONE = b"data: [DONE]"
_FIELD = {"chat": b'"content":"', "completions": b'"text":"'}


def kept_total() -> int:
    """Token ids kept now by this process's streams."""
    return _kept[0]


class Ledger:
    """One stream's ids and text as forwarded, and how its upstream ended."""

    __slots__ = (
        "endpoint",
        "strip",
        "limit",
        "total_limit",
        "_field",
        "_buf",
        "prompt_ids",
        "ids",
        "texts",
        "count",
        "reason",
        "template",
        "finish",
        "done",
        "aborted",
        "usage_seen",
        "last_at",
        "forwarded",
    )

    def __init__(self, endpoint: str, *, strip: bool, limit: int, total_limit: int) -> None:
        self.endpoint = endpoint
        self.strip = strip  # the proxy asked for the ids: the client must not see them
        self.limit = limit
        self.total_limit = total_limit
        self._field = _FIELD[endpoint]
        self._buf = b""
        self.prompt_ids: bytes | None = None  # raw "1,2,3" of the prompt's ids
        self.ids: list[bytes] = []  # raw ids of each forwarded chunk, in order
        self.texts: list[bytes] = []  # raw JSON string content of each forwarded chunk
        self.count = 0  # ids kept (prompt and answer)
        self.reason: str | None = None  # why this stream can no longer be continued
        # The first chunk forwarded: the continuation's chunks take its id, created and model.
        self.template: bytes | None = None
        self.finish: bytes | None = None  # the finish_reason the upstream ended with
        self.done = False  # the upstream sent [DONE]
        self.aborted = False  # the upstream ended with finish_reason "abort" (a cut)
        self.usage_seen = False
        self.last_at = time.monotonic()
        self.forwarded = 0  # data events forwarded to the client

    # The healthy path.
    def feed(self, data: bytes) -> bytes:
        """Take what the upstream sent; return what the client gets (whole events only)."""
        self.last_at = time.monotonic()
        if self._buf:
            data = self._buf + data
            self._buf = b""
        end = data.rfind(b"\n\n")
        if end == -1:
            self._buf = data
            return b""
        if end + 2 != len(data):
            self._buf = data[end + 2 :]
            data = data[: end + 2]
        if self.aborted:
            return b""  # after an abort nothing of this upstream reaches the client
        events = data.split(b"\n\n")
        events.pop()  # the empty piece after the last separator
        out = []
        for event in events:
            kept = self._event(event)
            if self.aborted:
                break
            if kept is not None:
                out.append(kept)
                out.append(b"\n\n")
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        if not event.startswith(b"data: {"):
            if event.startswith(_DONE):
                self.done = True
            return event
        i = event.find(_IDS)
        ids = b""
        if i != -1:
            close = event.find(b"]", i)
            ids = event[i + len(_IDS) : close]
            if self.strip:
                event = _cut(event, i, close + 1)
        if self.strip or self.prompt_ids is None:
            p = event.find(_PROMPT_IDS)
            if p != -1:
                close = event.find(b"]", p)
                if self.prompt_ids is None and self.reason is None:
                    self.prompt_ids = event[p + len(_PROMPT_IDS) : close]
                    self._count(self.prompt_ids)
                if self.strip:
                    event = _cut(event, p, close + 1)
                    t = event.find(_PROMPT_TEXT)
                    if t != -1:
                        value = t + len(_PROMPT_TEXT)
                        # vLLM sends `null` unless the request asked for the prompt's text.
                        if event.startswith(b"null", value):
                            end = value + 4
                        else:
                            end = _string_end(event, value + 1)
                        event = _cut(event, t + 1, end)
        f = event.find(_FINISH)
        if f != -1:
            reason = event[f + len(_FINISH) : event.find(b'"', f + len(_FINISH))]
            if reason == b"abort":
                # A sleep aborted it: a cut, never an end. Nothing of this chunk is forwarded,
                # so its ids count as not sent and the continuation generates them again.
                self.aborted = True
                return None
            self.finish = reason
        elif self.strip and self.endpoint == "chat" and _EMPTY_DELTA in event:
            if ids:
                self._keep(ids, b"")
            return None  # ids only: without return_token_ids the engine sends nothing
        if ids:
            self._keep(ids, self._text(event))
        elif b'"usage":{' in event and b'"choices":[]' in event:
            self.usage_seen = True
        if (
            self.endpoint == "chat"
            and self.reason is None
            and (b'"tool_calls"' in event or b'"reasoning' in event)
        ):
            self.stop("parsed")  # tool calls and reasoning are parsed by the chat endpoint only
        if self.template is None:
            self.template = event
        self.forwarded += 1
        return event

    def _text(self, event: bytes) -> bytes:
        start = event.find(self._field)
        if start == -1:
            return b""
        start += len(self._field)
        end = _string_end(event, start)
        return event[start : end - 1]

    def _keep(self, ids: bytes, text: bytes) -> None:
        if self.reason is not None:
            return
        self.ids.append(ids)
        self.texts.append(text)
        self._count(ids)

    def _count(self, ids: bytes) -> None:
        n = ids.count(b",") + 1 if ids else 0
        self.count += n
        _kept[0] += n
        if self.count > self.limit:
            self.stop("over_bound")
        elif _kept[0] > self.total_limit:
            self.stop("over_process_bound")

    # At a cut.
    def stop(self, reason: str) -> None:
        """Stop keeping this stream (it can no longer be continued); free what it kept."""
        if self.reason is None:
            self.reason = reason
        self.release()

    def release(self) -> None:
        """Free the ids this stream kept (its response is over)."""
        _kept[0] -= self.count
        self.count = 0
        self.ids = []
        self.texts = []
        self.prompt_ids = None if self.reason is not None else self.prompt_ids

    def answer_ids(self) -> list[int]:
        """The ids of the answer forwarded so far."""
        raw = b",".join(i for i in self.ids if i)
        return [int(x) for x in raw.split(b",")] if raw else []

    def prompt(self) -> list[int]:
        raw = self.prompt_ids or b""
        return [int(x) for x in raw.split(b",")] if raw else []

    def client_text(self) -> str:
        """The answer's text as the client has it."""
        return json.loads(b'"' + b"".join(self.texts) + b'"')

    def append(self, ids: list[int], text: str) -> None:
        """Record what a continuation forwarded, as if the upstream had sent it."""
        raw = ",".join(map(str, ids)).encode()
        self._keep(raw, json.dumps(text, ensure_ascii=False)[1:-1].encode())


def _cut(event: bytes, start: int, end: int) -> bytes:
    """Remove the field at [start, end) and the comma that joined it to its neighbours."""
    if event[start - 1 : start] == b",":
        return event[: start - 1] + event[end:]
    if event[end : end + 1] == b",":
        return event[:start] + event[end + 1 :]
    return event[:start] + event[end:]


def _string_end(data: bytes, start: int) -> int:
    """The index just past the closing quote of the JSON string whose content starts at
    `start`."""
    end = data.find(b'"', start)
    while end != -1:
        slashes = 0
        while data[end - 1 - slashes] == 0x5C:  # backslash
            slashes += 1
        if slashes % 2 == 0:
            return end + 1
        end = data.find(b'"', end + 1)
    return len(data)
