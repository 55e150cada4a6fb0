"""A stream cut by killing the simulated engine's process continues on the other domain's.

Two real `python -m supervisor.sim --generate` processes, east's and west's; the test kills
east's mid-stream (SIGKILL: connections reset, later connects refused), promotes west, and
compares what the client got with an uninterrupted stream, byte for byte (the engine's own
`id` and `created` aside, which differ per request).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleets.layouts.loader import parse_layout
from fleets.metrics import continuations as metrics
from fleets.models import Fleet
from fleets.services.layouts import layout_apply
from tests.proxy.conftest import CHAT, closed_port
from tests.proxy.test_proxy_hold import until_held
from tests.proxy.test_proxy_routing import promote

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

_ENGINE_STAMP = re.compile(rb'"id":"[^"]*","object":"([^"]*)","created":\d+')


def start_sim() -> tuple[subprocess.Popen, str]:
    port = closed_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.sim",
            "--port",
            str(port),
            "--model",
            "qwen-small",
            "--generate",
            "--token-delay-ms",
            "5",
        ],  # fmt: skip
        start_new_session=True,  # its own process group, killed as one
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail("simulated engine did not start")
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
async def sims(layout_data):
    (east, east_url), (west, west_url) = start_sim(), start_sim()
    try:
        urls = {"east": east_url, "west": west_url}
        for domain in layout_data["domains"]:
            for slot in domain["slots"]:
                for model in slot.get("models", []):
                    model["servingUrl"] = urls[domain["slug"]]

        def seed():
            layout_apply(layout=parse_layout(layout_data))
            return Fleet.objects.get(slug=layout_data["slug"])

        yield {"east": east, "west": west, "urls": urls, "fleet": await sync_to_async(seed)()}
    finally:
        stop(east)
        stop(west)


def unstamped(stream: bytes) -> bytes:
    return _ENGINE_STAMP.sub(rb'"id":"-","object":"\1","created":0', stream)


@pytest.mark.parametrize(("path", "endpoint"), [(CHAT, "chat"), ("/v1/completions", "completions")])
async def test_killing_the_engine_mid_stream_loses_no_token(
    haru, sims, hold_settings, path, endpoint
):
    if endpoint == "chat":
        request = {"model": "qwen-small", "messages": [{"role": "user", "content": "Tell más"}]}
    else:
        request = {"model": "qwen-small", "prompt": "Once upon a time, ünder"}
    request |= {"stream": True, "max_tokens": 300, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=sims["urls"]["west"], timeout=30) as direct:
        expected = (await direct.post(path, json=request)).content  # as a client sees it today

    got = b""
    async with haru.stream("POST", path, json=request) as response:
        async for chunk in response.aiter_raw():
            got += chunk
            if got.count(b"data: ") == 40 and sims["east"].poll() is None:
                stop(sims["east"])  # the active host's engine dies mid-answer
                await until_held(1)
                await sync_to_async(promote)(sims["fleet"], "west")

    assert unstamped(got) == unstamped(expected)
    events = [json.loads(e[6:]) for e in got.split(b"\n\n") if e.startswith(b"data: {")]
    assert len({e["id"] for e in events}) == 1 and len({e["created"] for e in events}) == 1
    assert sum(1 for e in events for c in e["choices"] if c.get("finish_reason")) == 1
    assert got.count(b"[DONE]") == 1 and got.count(b'"usage"') == 1
    if endpoint == "chat":
        assert sum(1 for e in events for c in e["choices"] if "role" in c["delta"]) == 1


async def test_waiting_for_the_hold_is_bounded(haru, sims, hold_settings):
    """No domain takes the continuation: the stream ends cut once the hold expires."""
    hold_settings(chat_hold_ms=300)
    expired = metrics.FAILURES.labels("demo", "hold_expired")._value.get()
    request = {"model": "qwen-small", "prompt": "x", "stream": True, "max_tokens": 200}
    with pytest.raises(httpx.RemoteProtocolError):
        async with haru.stream("POST", "/v1/completions", json=request) as response:
            async for _ in response.aiter_raw():
                if sims["east"].poll() is None:
                    stop(sims["east"])
    assert metrics.FAILURES.labels("demo", "hold_expired")._value.get() == expired + 1
