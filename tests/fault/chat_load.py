"""Chat traffic through the server's proxy for the length of a fault, every request recorded.

A few client loops on one asyncio loop in a thread of their own, half of them streaming, the two
models in turn, at a modest pace (the fault suite shares two cores with the deployment it
breaks). No retries anywhere: httpx retries nothing by default, and a failed request is
recorded and the loop moves on, so every failure a client would see is counted. A request is
good when it got a 200 and a complete answer: a JSON body with choices, or a stream that ended
with `data: [DONE]` (a stream cut after its headers is a failure too).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

import httpx

MODELS = ("qwen-small", "llama-small")
# Longer than the proxy's hold (HARU_CHAT_HOLD_MS, 30 s by default) plus a forwarded answer: a
# held request that is forwarded late still counts as served, one that is never answered fails.
REQUEST_TIMEOUT_S = 45.0


@dataclass(frozen=True)
class ChatRequest:
    started: float  # time.monotonic()
    ended: float
    ok: bool
    stream: bool
    error: str  # "" when ok; the status and error code, or the exception's name


class ChatLoad:
    """`clients` loops calling POST /v1/chat/completions, each pausing `pause_s` between calls."""

    def __init__(
        self, base_url: str, token: str, fleet: str, *, clients: int = 4, pause_s: float = 0.1
    ) -> None:
        self.base_url, self.token, self.fleet = base_url, token, fleet
        self.clients, self.pause_s = clients, pause_s
        self._records: list[ChatRequest] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-load", daemon=True)

    def start(self) -> ChatLoad:
        self._thread.start()
        return self

    def stop(self) -> list[ChatRequest]:
        """Stop the loops (each finishes the request it is in) and return every request."""
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 10)
        return self.requests()

    def requests(self) -> list[ChatRequest]:
        with self._lock:
            return list(self._records)

    def served(self) -> int:
        return sum(r.ok for r in self.requests())

    # -- the loops ---------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}", "X-Haru-Fleet": self.fleet},
            timeout=REQUEST_TIMEOUT_S,
            limits=httpx.Limits(max_connections=self.clients),
            trust_env=False,
        ) as http:
            await asyncio.gather(*(self._loop(http, i) for i in range(self.clients)))

    async def _loop(self, http: httpx.AsyncClient, index: int) -> None:
        stream = index % 2 == 1
        n = 0
        while not self._stop.is_set():
            body = {
                "model": MODELS[n % len(MODELS)],
                "messages": [{"role": "user", "content": f"client {index} request {n}"}],
                "max_tokens": 8,
                "stream": stream,
            }
            n += 1
            started = time.monotonic()
            try:
                error = await (self._streamed(http, body) if stream else self._plain(http, body))
            except httpx.HTTPError as exc:
                error = type(exc).__name__
            record = ChatRequest(started, time.monotonic(), not error, stream, error)
            with self._lock:
                self._records.append(record)
            await asyncio.sleep(self.pause_s)

    @staticmethod
    async def _plain(http: httpx.AsyncClient, body: dict) -> str:
        response = await http.post("/chat/completions", json=body)
        if response.status_code != 200:
            return _status_error(response)
        try:
            choices = response.json().get("choices")
        except ValueError:
            return "200 unparsable body"
        return "" if choices else "200 no choices"

    @staticmethod
    async def _streamed(http: httpx.AsyncClient, body: dict) -> str:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return _status_error(response)
            text = "".join([chunk async for chunk in response.aiter_text()])
        return "" if "data: [DONE]" in text else "200 stream without [DONE]"


def _status_error(response: httpx.Response) -> str:
    code = ""
    with contextlib.suppress(ValueError, AttributeError, KeyError, TypeError):
        code = response.json()["error"]["code"]
    return f"{response.status_code} {code}".strip()


def failures(requests: list[ChatRequest]) -> list[ChatRequest]:
    return [r for r in requests if not r.ok]


def started_between(requests: list[ChatRequest], start: float, end: float) -> list[ChatRequest]:
    return [r for r in requests if start <= r.started < end]


def in_flight_at(requests: list[ChatRequest], start: float, end: float) -> list[ChatRequest]:
    """The requests that had started before `end` and were still open at `start`."""
    return [r for r in requests if r.started < end and r.ended > start]
