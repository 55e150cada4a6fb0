"""What the proxy keeps of a stream it may have to continue, and the stripping that hides it.

For a streamed request to an engine that can continue (fleets/core/continuation.py), the proxy
asks the engine for token ids in the same request (`return_token_ids`). The ledger reads each
server-sent event as it passes: it keeps the prompt's ids and the ids of every chunk it
forwards, and removes the id fields (and chat chunks that
carry nothing but ids) so the client sees what it would have without them.

The healthy path pays for this on every chunk, so it works on bytes: vLLM serializes compactly
and in a fixed field order (pydantic's `model_dump_json`), so a few `bytes.find` calls locate
the fields, and JSON is parsed only on the rare chunk that needs it. The ids are kept as the
raw bytes between their brackets and parsed once, if ever, at a cut.

Bounds: HARU_CHAT_CONTINUE_MAX_IDS per stream and HARU_CHAT_CONTINUE_MAX_IDS_TOTAL per process;
a stream past either stops being kept (`reason` says why) and, if cut, ends as it did before.
"""

from __future__ import annotations

from time import monotonic as _monotonic

# Token ids kept right now by every ledger of this process (the per-process bound).
_kept = [0]

_IDS = b'"token_ids":['
_PROMPT_IDS = b'"prompt_token_ids":['
# Fields the simulator writes only when asked for ids (vLLM writes them either way).
_STOP_REASON = b',"stop_reason":'
_PROMPT_TEXT = b',"prompt_text":'
_FINISH = b'"finish_reason":"'
_EMPTY_DELTA = b'"delta":{}'
_DONE = b"data: [DONE]"


def kept_total() -> int:
    """Token ids kept now by this process's streams."""
    return _kept[0]


class Ledger:
    """One stream's ids as forwarded, and how its upstream ended.

    Its text is not kept: what the client has is worked out at a cut from the ids, as the
    engine's detokenizer wrote it (fleets/core/continuation.py `client_end`).
    """

    __slots__ = (
        "endpoint",
        "strip",
        "nulls",
        "limit",
        "total_limit",
        "chat",
        "_buf",
        "prompt_ids",
        "ids",
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

    def __init__(
        self, endpoint: str, *, strip: bool, limit: int, total_limit: int, nulls: bool = True
    ) -> None:
        self.endpoint = endpoint
        self.strip = strip  # the proxy asked for the ids: the client must not see them
        # How the engine writes a stream without ids: vLLM writes the id fields as null (and
        # stop_reason always); the simulator leaves them and stop_reason out.
        self.nulls = nulls
        self.limit = limit
        self.total_limit = total_limit
        self.chat = endpoint == "chat"
        self._buf = b""
        self.prompt_ids: bytes | None = None  # raw "1,2,3" of the prompt's ids
        self.ids: list[bytes] = []  # raw ids of each forwarded chunk, in order
        self.count = 0  # ids kept (prompt and answer)
        self.reason: str | None = None  # why this stream can no longer be continued
        # The first chunk forwarded: the continuation's chunks take its id, created and model.
        self.template: bytes | None = None
        self.finish: bytes | None = None  # the finish_reason the upstream ended with
        self.done = False  # the upstream sent [DONE]
        self.aborted = False  # the upstream ended with finish_reason "abort" (a cut)
        self.usage_seen = False
        self.last_at = _monotonic()
        self.forwarded = 0  # data events forwarded to the client

    # The healthy path.
    def feed(self, data: bytes) -> bytes:
        """Take what the upstream sent; return what the client gets (whole events only)."""
        self.last_at = _monotonic()
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self.aborted:
            return b""  # after an abort nothing of this upstream reaches the client
        if data.find(b"\n\n") == len(data) - 2 > 0:
            # One whole event per read: the usual case, taken without a split.
            return self._event(data) or b""
        end = data.rfind(b"\n\n")
        if end == -1:
            self._buf = data
            return b""
        if end + 2 != len(data):
            self._buf = data[end + 2 :]
            data = data[: end + 2]
        out = []
        for event in data.split(b"\n\n")[:-1]:
            kept = self._event(event + b"\n\n")
            if self.aborted:
                break
            if kept is not None:
                out.append(kept)
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        """Handle one event (its "\\n\\n" included); return what the client gets of it.

        The hot path of a kept stream: written inline, every field found with bytes.find.
        """
        if not event.startswith(b"data: {"):
            if event.startswith(_DONE):
                self.done = True
            return event
        strip = self.strip
        if self.forwarded == 0:
            event = self._prompt(event)  # the first chunk carries the prompt's ids
        i = event.find(_IDS)
        if i != -1:
            close = event.find(b"]", i)
            ids = event[i + 13 : close]  # 13: len(_IDS)
            if strip:
                if self.nulls:
                    event = event[: i + 12] + b"null" + event[close + 1 :]
                else:
                    # The simulator writes stop_reason (and on completions the prompt's ids,
                    # null after the first chunk) just before the ids, and only with them.
                    at = event.rfind(_STOP_REASON, 0, i)
                    event = event[: at if at != -1 else i - 1] + event[close + 1 :]
        else:
            ids = b""
        f = event.find(_FINISH)
        if f != -1:
            reason = event[f + 17 : event.find(b'"', f + 17)]  # 17: len(_FINISH)
            if reason == b"abort":
                # A sleep aborted it: a cut, never an end. Nothing of this chunk is forwarded,
                # so its ids count as not sent and the continuation generates them again.
                self.aborted = True
                return None
            self.finish = reason
        elif strip and self.chat and _EMPTY_DELTA in event:
            if ids:
                self._keep(ids)
            return None  # ids only: without return_token_ids the engine sends nothing
        if ids:
            if self.reason is None:
                # _keep, inline.
                self.ids.append(ids)
                n = ids.count(b",") + 1
                self.count += n
                _kept[0] += n
                if self.count > self.limit or _kept[0] > self.total_limit:
                    self._count(0)
        elif b'"usage":{' in event and b'"choices":[]' in event:
            self.usage_seen = True
        if (
            self.chat
            and self.reason is None
            and (b'"tool_calls"' in event or b'"reasoning' in event)
        ):
            self.stop("parsed")  # tool calls and reasoning are parsed by the chat endpoint only
        if self.template is None:
            self.template = event
        self.forwarded += 1
        return event

    def _prompt(self, event: bytes) -> bytes:
        """Keep the prompt's ids (the first chunk's); strip what the client must not see."""
        p = event.find(_PROMPT_IDS)
        if p != -1:
            close = event.find(b"]", p)
            if self.prompt_ids is None and self.reason is None:
                self.prompt_ids = event[p + len(_PROMPT_IDS) : close]
                self._count(self.prompt_ids.count(b",") + 1 if self.prompt_ids else 0)
            if self.strip:
                event = _drop(event, p, close + 1, self.nulls)
        if self.strip and not self.nulls:
            at = event.find(_PROMPT_TEXT)  # the simulator's, only with ids
            if at != -1:
                event = _cut(event, at + 1, _value_end(event, at + len(_PROMPT_TEXT)))
        return event

    def _keep(self, ids: bytes) -> None:
        if self.reason is not None:
            return
        self.ids.append(ids)
        self._count(ids.count(b",") + 1 if ids else 0)

    def _count(self, n: int) -> None:
        """Count `n` more ids kept, then stop keeping the stream past a bound."""
        if n:
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
        self.prompt_ids = None if self.reason is not None else self.prompt_ids

    def answer_ids(self) -> list[int]:
        """The ids of the answer forwarded so far."""
        raw = b",".join(i for i in self.ids if i)
        return [int(x) for x in raw.split(b",")] if raw else []

    def prompt(self) -> list[int]:
        raw = self.prompt_ids or b""
        return [int(x) for x in raw.split(b",")] if raw else []

    def append(self, ids: list[int]) -> None:
        """Record the ids a continuation forwarded, as if the upstream had sent them."""
        if ids:
            self._keep(",".join(map(str, ids)).encode())


def _cut(event: bytes, start: int, end: int) -> bytes:
    """Remove the field at [start, end) and the comma that joined it to its neighbours."""
    if event[start - 1 : start] == b",":
        return event[: start - 1] + event[end:]
    if event[end : end + 1] == b",":
        return event[:start] + event[end + 1 :]
    return event[:start] + event[end:]


def _drop(event: bytes, start: int, end: int, nulls: bool) -> bytes:
    """Remove the id field at [start, end), or write its value as null (`nulls`)."""
    if nulls:
        return event[: event.index(b":", start) + 1] + b"null" + event[end:]
    return _cut(event, start, end)


def _value_end(data: bytes, start: int) -> int:
    """The index just past the JSON scalar (string, number, null) that starts at `start`."""
    if data[start : start + 1] == b'"':
        return _string_end(data, start + 1)
    ends = [i for i in (data.find(b",", start), data.find(b"}", start)) if i != -1]
    return min(ends) if ends else len(data)


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
