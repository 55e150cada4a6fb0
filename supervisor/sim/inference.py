"""The simulated engine's inference routes, as raw ASGI so they notice a client going away.

A streaming response whose client disconnects must stop and count as cancelled: the chat proxy
tests rely on that to prove a client disconnect cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from supervisor.sim import replies

if TYPE_CHECKING:
    from supervisor.sim.engine import SimEngine


class DisconnectWatch:
    """Listen for the client going away while a response is being produced."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return

    async def pause(self, seconds: float) -> bool:
        """Wait; return False if the client disconnected first."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.gone.wait(), seconds)
        return not self.gone.is_set()

    def close(self) -> None:
        self._task.cancel()


class InferenceEndpoint:
    """POST /v1/chat/completions or /v1/completions."""

    def __init__(self, engine: SimEngine, *, chat: bool) -> None:
        self.engine = engine
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine = self.engine
        body = await _read_body(receive)
        if body is None:
            return  # the client left before sending its request
        engine.record_request(scope, body)
        engine.stats.requests += 1
        if engine.sleeping and engine.holds_while_asleep:
            # vLLM holds a request that arrives while asleep and answers it after the wake.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(engine.awake.wait(), engine.HOLD_S)
        if scope["method"] != "POST":
            await _send(send, 405, replies.openai_error("use POST", "invalid_request_error", 405))
            return
        admitted = self._admit(body)
        if isinstance(admitted, tuple):
            engine.stats.rejected += 1
            await _send(send, *admitted)
            return
        completion = replies.plan_completion(
            request_id=engine.next_id("chatcmpl" if self.chat else "cmpl"),
            created=int(time.time()),
            model=engine.options.model,
            body=body,
            payload=admitted,
            chat=self.chat,
            reply=engine.reply,
            echo=engine.options.echo,
        )
        engine.stats.inflight += 1
        try:
            if admitted.get("stream") is True:
                finished = await self._stream(completion, admitted, receive, send)
            else:
                finished = await self._whole(completion, receive, send)
        finally:
            engine.stats.inflight -= 1
        if finished:
            engine.stats.completed += 1
        else:
            engine.stats.cancelled += 1

    def _admit(self, body: bytes) -> tuple[int, bytes] | dict[str, Any]:
        """Return the parsed payload, or (status, body) when the request is refused."""
        engine = self.engine
        if not engine.loaded:
            return 503, replies.openai_error("model is loading", "ServiceUnavailable", 503)
        if engine.sleeping:
            return 503, replies.openai_error("model is sleeping", "ServiceUnavailable", 503)
        if engine.faults.inference_5xx:
            return 500, replies.openai_error("simulated failure", "InternalServerError", 500)
        try:
            payload = json.loads(body)
        except ValueError:
            return 400, replies.openai_error("body is not valid JSON", "BadRequestError", 400)
        if not isinstance(payload, dict):
            return 400, replies.openai_error("body must be an object", "BadRequestError", 400)
        if payload.get("model") != engine.options.model:
            message = f"The model `{payload.get('model')}` does not exist."
            return 404, replies.openai_error(message, "NotFoundError", 404)
        return payload

    async def _whole(self, c: replies.Completion, receive: Receive, send: Send) -> bool:
        o = self.engine.options
        delay = (o.ttft_ms + o.token_delay_ms * max(len(c.tokens) - 1, 0)) / 1000
        if delay > 0:
            watch = DisconnectWatch(receive)
            try:
                if not await watch.pause(delay):
                    return False
            finally:
                watch.close()
        body = replies.chat_body(c) if self.chat else replies.completion_body(c)
        await _send(send, 200, replies.dumps(body))
        return True

    async def _stream(
        self, c: replies.Completion, payload: dict[str, Any], receive: Receive, send: Send
    ) -> bool:
        o = self.engine.options
        options = payload.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        watch = DisconnectWatch(receive)
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
                await _chunk(
                    send, replies.chat_chunk(c, {"role": "assistant", "content": ""}, None)
                )
            for i, token in enumerate(c.tokens):
                if i and not await watch.pause(o.token_delay_ms / 1000):
                    return False
                if watch.gone.is_set():
                    return False
                if self.chat:
                    await _chunk(send, replies.chat_chunk(c, {"content": token}, None))
                else:
                    await _chunk(send, replies.completion_chunk(c, token, None))
            if self.chat:
                await _chunk(send, replies.chat_chunk(c, {}, c.finish_reason))
            else:
                await _chunk(send, replies.completion_chunk(c, "", c.finish_reason))
            if include_usage:
                await _chunk(send, replies.usage_chunk(c, self.chat))
            await send({"type": "http.response.body", "body": replies.DONE, "more_body": False})
            return True
        finally:
            watch.close()


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
