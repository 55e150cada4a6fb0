"""The simulated engine's inference routes, as raw ASGI so they notice a client going away.

A streaming response whose client disconnects must stop and count as cancelled: the chat proxy
tests rely on that to prove a client disconnect cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from starlette.types import Receive, Scope, Send

from supervisor.sim import adapters, replies, tokens
from supervisor.sim.options import Faults, SimOptions, Stats


class Engine(Protocol):
    """What the inference routes need of the engine (engine.py's SimEngine)."""

    options: SimOptions
    faults: Faults
    stats: Stats
    loaded: bool
    resumed: asyncio.Event

    def record_request(self, scope: Any, body: bytes) -> None: ...
    def authorized(self, scope: Any) -> bool: ...
    def next_id(self, prefix: str) -> str: ...
    def serves(self, name: object) -> bool: ...

    tokenizer: tokens.Tokenizer

    def reply_for(self, name: str, prompt: str = "") -> str: ...
    async def lora_admit(self, name: str) -> tuple[int, str] | None: ...
    def generation_for(self, name: str) -> replies.GenerationSettings | None: ...
    def generation_started(self) -> asyncio.Event: ...
    def generation_ended(self) -> None: ...


class DisconnectWatch:
    """Listen for the client going away while a response is being produced.

    A pause also ends early when `abort` is set (an aborting sleep), returning True: the
    caller then finishes the reply with what it has.
    """

    def __init__(self, receive: Receive, abort: asyncio.Event | None = None) -> None:
        self.gone = asyncio.Event()
        self._abort = abort
        # The pause in progress: one future and one timer per token, resolved early by the
        # two watchers below (each made once per request, not per token).
        self._waiter: asyncio.Future[None] | None = None
        self._tasks = [asyncio.create_task(self._watch(receive))]
        if abort is not None:
            self._tasks.append(asyncio.create_task(self._watch_abort(abort)))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                self._wake()
                return

    async def _watch_abort(self, abort: asyncio.Event) -> None:
        await abort.wait()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def pause(self, seconds: float) -> bool:
        """Wait; return False if the client disconnected first."""
        aborted = self._abort is not None and self._abort.is_set()
        if seconds > 0 and not aborted and not self.gone.is_set():
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(seconds, self._wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return not self.gone.is_set()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()


class InferenceEndpoint:
    """POST /v1/chat/completions or /v1/completions."""

    def __init__(self, engine: Engine, *, chat: bool) -> None:
        self.engine = engine
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine = self.engine
        body = await _read_body(receive)
        if body is None:
            return  # the client left before sending its request
        engine.record_request(scope, body)
        engine.stats.requests += 1
        if scope["method"] != "POST":
            await _send(send, 405, replies.openai_error("use POST", "invalid_request_error", 405))
            return
        if not engine.authorized(scope):
            engine.stats.rejected += 1
            await _send(send, 401, replies.dumps({"error": "Unauthorized"}))
            return
        admitted = self._admit(body)
        if isinstance(admitted, tuple):
            engine.stats.rejected += 1
            await _send(send, *admitted)
            return
        engine.stats.inflight += 1
        try:
            # A runtime LoRA adapter evicted from the cache is read again first, and a bad
            # version fails or lags here, as its own engine-side error would.
            failed = await engine.lora_admit(admitted["model"])
            if failed is not None:
                engine.stats.rejected += 1
                status, message = failed
                kind = "NotFoundError" if status == 404 else "InternalServerError"
                await _send(send, status, replies.openai_error(message, kind, status))
                return
            await self._generate(body, admitted, receive, send)
        finally:
            engine.stats.inflight -= 1

    async def _generate(
        self, body: bytes, admitted: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        engine = self.engine
        if not engine.resumed.is_set():
            # Asleep: vLLM holds the request, unanswered, and serves it right after the wake.
            watch = DisconnectWatch(receive)
            try:
                resumed = asyncio.ensure_future(engine.resumed.wait())
                gone = asyncio.ensure_future(watch.gone.wait())
                await asyncio.wait({resumed, gone}, return_when=asyncio.FIRST_COMPLETED)
                resumed.cancel()
                gone.cancel()
                if watch.gone.is_set():
                    engine.stats.cancelled += 1
                    return
            finally:
                watch.close()
        try:
            completion = replies.plan_completion(
                request_id=engine.next_id("chatcmpl" if self.chat else "cmpl"),
                created=int(time.time()),
                model=admitted["model"],
                body=body,
                payload=admitted,
                chat=self.chat,
                reply=engine.reply_for(
                    admitted["model"], adapters.request_prompt(admitted, self.chat)
                ),
                echo=engine.options.echo,
                tokenizer=engine.tokenizer,
                generation=engine.generation_for(admitted["model"]),
            )
        except replies.RequestError as refused:
            engine.stats.rejected += 1
            await _send(send, 400, replies.openai_error(str(refused), "BadRequestError", 400))
            return
        abort = engine.generation_started()
        try:
            if admitted.get("stream") is True:
                finished = await self._stream(completion, admitted, receive, send, abort)
            else:
                finished = await self._whole(completion, receive, send, abort)
        finally:
            engine.generation_ended()
        if finished:
            engine.stats.completed += 1
        else:
            engine.stats.cancelled += 1

    def _admit(self, body: bytes) -> tuple[int, bytes] | dict[str, Any]:
        """Return the parsed payload, or (status, body) when the request is refused."""
        engine = self.engine
        if not engine.loaded:
            return 503, replies.openai_error("model is loading", "ServiceUnavailable", 503)
        if engine.faults.inference_5xx:
            return 500, replies.openai_error("simulated failure", "InternalServerError", 500)
        payload = _json_object(body)
        if isinstance(payload, tuple):
            return payload
        if not engine.serves(payload.get("model")):
            # vLLM's own wording and envelope, so a proxy passing it through is tested on it.
            message = (
                f"The model `{payload.get('model')}` does not exist. "
                f"Valid aliases: {engine.options.model}."
            )
            return 404, replies.openai_error(message, "NotFoundError", 404, param="model")
        return payload

    async def _whole(
        self, c: replies.Completion, receive: Receive, send: Send, abort: asyncio.Event
    ) -> bool:
        o = self.engine.options
        watch = DisconnectWatch(receive, abort)
        try:
            if not await watch.pause(o.ttft_ms / 1000):
                return False
            sent: list[replies.Step] = []
            aborted = False
            for step in c.steps():
                if sent and not await watch.pause(o.token_delay_ms / 1000):
                    return False
                if sent and abort.is_set():
                    # An aborting sleep: vLLM answers 200 with the text so far.
                    aborted = True
                    break
                sent.append(step)
            c = c.settled(sent)
            if aborted:
                c = c.cut(len(sent))
        finally:
            watch.close()
        body = replies.chat_body(c) if self.chat else replies.completion_body(c)
        await _send(send, 200, replies.dumps(body))
        return True

    async def _stream(
        self,
        c: replies.Completion,
        payload: dict[str, Any],
        receive: Receive,
        send: Send,
        abort: asyncio.Event,
    ) -> bool:
        o = self.engine.options
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        watch = DisconnectWatch(receive, abort)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            # Headers go out at once (as vLLM's do); the first chunk only after the TTFT.
            if not await watch.pause(o.ttft_ms / 1000):
                return False
            if self.chat:
                await _chunk(send, replies.chat_role_chunk(c))
            sent: list[replies.Step] = []
            aborted = False
            for step in c.steps():
                if sent and not await watch.pause(o.token_delay_ms / 1000):
                    return False
                if watch.gone.is_set():
                    return False
                if abort.is_set():
                    aborted = True
                    break
                first = not sent
                sent.append(step)
                why = step.stop_reason
                if self.chat:
                    chunk = replies.chat_chunk(
                        c, {"content": step.text}, step.finish, step.ids, why
                    )
                else:
                    chunk = replies.completion_chunk(
                        c, step.text, step.finish, step.ids, why, first=first
                    )
                await _chunk(send, chunk)
            c = c.settled(sent)
            if aborted:
                c = c.cut(len(sent))
            if aborted or not c.generated:
                # The scripted reply's finish, and any abort's, is a chunk of its own.
                if self.chat:
                    # vLLM's own finish chunk (an abort) says content "": the scripted one {}.
                    delta = {"content": ""} if c.generated else {}
                    chunk = replies.chat_chunk(c, delta, c.finish_reason, (), c.stop_reason)
                else:
                    chunk = replies.completion_chunk(
                        c, "", c.finish_reason, (), c.stop_reason, first=not sent
                    )
                await _chunk(send, chunk)
            if include_usage:
                await _chunk(send, replies.usage_chunk(c, self.chat))
            await send({"type": "http.response.body", "body": replies.DONE, "more_body": False})
            return True
        finally:
            watch.close()


class DetokenizeEndpoint:
    """vLLM's POST /detokenize: the exact text of the ids (special tokens as their text).

    Raw ASGI like the inference endpoints: a continued stream's seam asks it once per stream,
    in the same burst as the continuations themselves."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is not None:
            await _send(send, *self.answer(body))

    def answer(self, body: bytes) -> tuple[int, bytes]:
        payload = _json_object(body or b"{}")
        if isinstance(payload, tuple):
            return payload
        name = payload.get("model")
        if name is not None and not self.engine.serves(name):
            message = f"The model `{name}` does not exist."
            return 404, replies.openai_error(message, "NotFoundError", 404)
        ids = payload.get("tokens")
        if not isinstance(ids, list):
            message = "`tokens` must be a list of token ids"
            return 400, replies.openai_error(message, "BadRequestError", 400)
        tokenizer = self.engine.tokenizer
        bad = tokenizer.out_of_vocabulary(ids)
        if bad is not None:
            message = f"Token id {bad} is out of vocabulary"
            return 400, replies.openai_error(message, "BadRequestError", 400)
        return 200, replies.dumps({"prompt": tokenizer.decode(ids)})


def _json_object(body: bytes) -> dict[str, Any] | tuple[int, bytes]:
    """The request's JSON object, or (status, body) refusing it in vLLM's envelope."""
    try:
        payload = json.loads(body)
    except ValueError:
        return 400, replies.openai_error("body is not valid JSON", "BadRequestError", 400)
    if not isinstance(payload, dict):
        return 400, replies.openai_error("body must be an object", "BadRequestError", 400)
    return payload


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})
