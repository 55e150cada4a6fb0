"""A model-server double that speaks vLLM's token-id shapes, for the continuation tests.

Two wires: `wire="vllm"` writes what vLLM 0.32 writes without ids (the id fields as null),
`wire="sim"` what Haru's simulator writes (no id fields, no stop_reason, a chat chunk for
every token). Its tokenizer is byte-level (one id per UTF-8 byte, offset by 3; 2 is BOS), so
an answer with multi-byte characters puts some cuts inside a character, as a real tokenizer
can. It answers
deterministically from the prompt's ids: the prompt is the request's prompt followed by the
first k bytes of ANSWER, and it goes on from byte k. Chunks are serialized the way vLLM 0.32
does (pydantic's compact JSON, its field order, `exclude_unset`), with fixed `id` and
`created`, so a continued stream can be compared byte for byte with an uninterrupted one.

Scripted faults: `cut_after` tokens, then the connection is reset (`cut="reset"`), the body
ends without its last chunk (`cut="eof"`) or the stream ends with finish_reason "abort"
(`cut="abort"`); `rewind` imitates vLLM's first continued chunk when the prompt ends inside a
character (it re-emits the earlier answer as text).
"""

from __future__ import annotations

import asyncio
import json

ANSWER = "Bonjour, ça va? Très bien, merci — et toi? 日本語も少し話せます。" * 3
BOS, EOS, OFFSET = 2, 1, 3
CREATED = 1_700_000_000


def encode(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")


ANSWER_IDS = encode(ANSWER)


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class VllmDouble:
    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[dict] = []
        self.cut_after: int | None = None
        self.cut = "reset"
        self.rewind = False
        self.token_ids = True  # False: an engine that ignores return_token_ids
        self.delay = 0.0
        self.first_delay = 0.0  # before a stream's first event, as an engine's prefill
        self.headers_delay = 0.0  # before a stream's headers, as an engine's queue
        self.headers_sent = True  # whether the latest stream's headers went out (per /detokenize)
        self.events_sent = 0  # events of the latest stream so far, noted with each /detokenize
        self.refuse = False  # answer 503 (not handled)
        self.hang_detokenize = 0  # the next this many /detokenize requests are never answered
        self.cuts = 0
        # How a stream without ids is written: "vllm" as vLLM 0.32 (id fields as null,
        # stop_reason always), "sim" as Haru's simulator (neither).
        self.wire = "vllm"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        doc = json.loads(body) if body else {}
        self.requests.append(
            {
                "path": scope["path"],
                "body": doc,
                "refused": self.refuse,
                "events_sent": self.events_sent,
                "headers_sent": self.headers_sent,
            }
        )
        if self.refuse:
            await _answer(send, 503, b"{}")
            return
        if scope["path"] == "/detokenize":
            if self.hang_detokenize > 0:
                self.hang_detokenize -= 1
                await asyncio.sleep(3600)
            await _answer(send, 200, dumps({"prompt": decode(doc["tokens"])}).encode())
            return
        chat = scope["path"].endswith("/chat/completions")
        prompt = prompt_ids(doc, chat)
        done = 0  # how much of the answer the prompt already holds
        for base in (prompt_ids_of_request(True), prompt_ids_of_request(False)):
            if prompt[: len(base)] == base and len(prompt) > len(base):
                done = len(prompt) - len(base)
        limit = doc.get("max_tokens") or doc.get("max_completion_tokens") or 10_000
        ids = ANSWER_IDS[done : done + limit]
        finish = "length" if done + limit < len(ANSWER_IDS) else "stop"
        if finish == "stop":
            ids = [*ids, EOS]
        if not doc.get("stream"):
            await self._whole(send, doc, chat, prompt, ids, finish)
            return
        self.headers_sent = False
        if self.headers_delay:
            await asyncio.sleep(self.headers_delay)
        self.headers_sent = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        self.events_sent = 0
        if self.first_delay:
            await asyncio.sleep(self.first_delay)
        for event in self._events(doc, chat, prompt, ids, finish, done):
            if event is None:  # the scripted cut; the engine is gone until told otherwise
                self.refuse = True
                self.cuts += 1
                if self.cut == "hang":
                    await asyncio.sleep(3600)
                if self.cut == "reset":
                    raise ConnectionResetError("engine died")
                await send({"type": "http.response.body", "body": b""})
                return
            await send({"type": "http.response.body", "body": event, "more_body": True})
            self.events_sent += 1
            if self.delay:
                await asyncio.sleep(self.delay)
        await send({"type": "http.response.body", "body": b""})

    def _events(self, doc, chat, prompt, ids, finish, done):
        want_ids = bool(doc.get("return_token_ids")) and self.token_ids
        head = (
            f'{{"id":"{"chatcmpl" if chat else "cmpl"}-7","object":'
            f'"{"chat.completion.chunk" if chat else "text_completion"}",'
            f'"created":{CREATED},"model":"{doc["model"]}",'
        )
        first = True
        if chat:
            listed = dumps(prompt) if want_ids else "null"
            extra = f',"prompt_token_ids":{listed},"prompt_text":null'
            if self.wire == "sim" and not want_ids:
                extra = ""
            choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            yield f'data: {head}"choices":[{choice}"finish_reason":null}}]{extra}}}\n\n'.encode()
            first = False
        answer_bytes = bytes(i - OFFSET for i in prompt if i >= OFFSET)
        # Bytes of a character not complete yet (vLLM holds them back); a prompt that ends
        # inside one starts with its first bytes, as vLLM's detokenizer has them in context.
        pending = incomplete_tail(answer_bytes) if done else b""
        answer_bytes = answer_bytes[: len(answer_bytes) - len(pending)]
        rewind = self.rewind and done > 0
        stop = doc.get("stop") or []
        stops = [stop] if isinstance(stop, str) else stop
        include = bool(doc.get("include_stop_str_in_output"))
        hold = max((len(x) for x in stops), default=1) - 1 if not include else 0
        out, offset, generated = "", 0, 0
        for n, token in enumerate(ids):
            if self.cut_after is not None and n == self.cut_after:
                if self.cut == "abort":
                    self.refuse = True
                    self.cuts += 1
                    choice = self._choice(chat, "", "abort", [], want_ids, None)
                    yield f"data: {head}{choice}}}\n\n".encode()
                    yield b"data: [DONE]\n\n"
                    return
                yield None
                return
            last = n == len(ids) - 1
            piece = b"" if token == EOS else bytes([token - OFFSET])
            pending += piece
            try:
                text = pending.decode()
                pending = b""
            except UnicodeDecodeError:
                text = ""
            if text and rewind:
                # vLLM's detokenizer, started inside a character: the whole prompt comes out.
                text = (answer_bytes + text.encode()).decode(errors="replace")
                rewind = False
            out += text
            fin, stop_reason = (finish if last else None), None
            hit = _first_stop(out, len(text), stops) if text else None
            if hit is not None:
                at, stop_reason = hit
                out = out[: at + len(stop_reason)] if include else out[:at]
                fin = "stop"
            # Like vLLM's detokenizer: the last characters wait while a stop may complete.
            end = len(out) if fin else max(len(out) - hold, offset)
            delta, offset = out[offset:end], end
            generated = n + 1
            if not delta and fin is None and not want_ids and chat and self.wire == "vllm":
                continue  # vLLM sends no chunk without text, unless ids are asked for
            choice = self._choice(chat, delta, fin, [token], want_ids, stop_reason)
            if first and not chat and want_ids:
                choice = choice.replace(
                    '"prompt_token_ids":null', f'"prompt_token_ids":{dumps(prompt)}'
                )
            first = False
            yield f"data: {head}{choice}}}\n\n".encode()
            if fin is not None:
                break
        if (doc.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt),
                "total_tokens": len(prompt) + generated,
                "completion_tokens": generated,
            }
            yield f'data: {head}"choices":[],"usage":{dumps(usage)}}}\n\n'.encode()
        yield b"data: [DONE]\n\n"

    def _choice(self, chat, text, finish, ids, want_ids, stop_reason) -> str:
        fin = "null" if finish is None else f'"{finish}"'
        full = self.wire == "vllm" or want_ids  # the simulator writes these only with ids
        if chat:
            delta = f'{{"content":{dumps(text)}}}' if text or self.wire == "sim" else "{}"
            out = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{fin}'
            if finish is not None and full:
                out += f',"stop_reason":{dumps(stop_reason)}'
        else:
            out = f'{{"index":0,"text":{dumps(text)},"logprobs":null,"finish_reason":{fin}'
            if full:
                out += f',"stop_reason":{dumps(stop_reason)},"prompt_token_ids":null'
        if full:
            out += f',"token_ids":{dumps(ids) if want_ids else "null"}'
        return f'"choices":[{out}}}]'

    async def _whole(self, send, doc, chat, prompt, ids, finish) -> None:
        if self.cut_after is not None:
            self.refuse = True
            self.cuts += 1
            if self.cut == "abort":
                ids, finish = ids[: self.cut_after], "abort"
            else:
                raise ConnectionResetError("engine died")
        text = decode([i for i in ids if i != EOS])
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        payload = {"id": "x", "engine": self.name, "choices": [choice]}
        await _answer(send, 200, dumps(payload).encode())


async def _answer(send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(payload)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _first_stop(out: str, added: int, stops: list[str]) -> tuple[int, str] | None:
    """The earliest stop string that ends in the text just added, as vLLM looks for it."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = out.find(stop, max(len(out) - added - len(stop) + 1, 0))
        if at != -1 and (best is None or at < best[0]):
            best = (at, stop)
    return best


def incomplete_tail(data: bytes) -> bytes:
    """The bytes at the end of `data` that begin a character not finished yet."""
    for k in (1, 2, 3):
        if len(data) >= k and 0xC0 <= data[-k] <= 0xF7:  # the lead byte of a character
            need = 2 if data[-k] < 0xE0 else 3 if data[-k] < 0xF0 else 4
            return data[-k:] if k < need else b""
    return b""


def prompt_ids_of_request(chat: bool) -> list[int]:
    return [BOS, *encode("user: hi\nassistant:")] if chat else [BOS, *encode("Say hi")]


def prompt_ids(doc: dict, chat: bool) -> list[int]:
    prompt = doc.get("prompt")
    if isinstance(prompt, list):
        return prompt
    return prompt_ids_of_request(chat)
