"""The proxy in front of the real simulated engine (`python -m supervisor.sim`), a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from asgiref.sync import sync_to_async

from fleets.layouts.loader import parse_layout
from fleets.services.layouts import layout_apply
from tests.proxy.conftest import CHAT, chat_body, closed_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REPLY = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(scope="module")
def sim_url():
    """One simulated engine serving qwen-small, streaming a token every 20 ms."""
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
            "--token-delay-ms",
            "20",
            "--reply",
            REPLY,
        ],
        start_new_session=True,  # its own process group, killed as one
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"simulated engine exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("simulated engine did not start")
            time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()


@pytest.fixture
async def sim(sim_url, layout_data):
    """Seed the demo fleet with east's qwen-small on the simulated engine; reset its counters."""

    for domain in layout_data["domains"]:
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                on_sim = domain["slug"] == "east" and model["name"] == "qwen-small"
                model["servingUrl"] = sim_url if on_sim else f"http://127.0.0.1:{closed_port()}"
    await sync_to_async(layout_apply)(layout=parse_layout(layout_data))
    async with httpx.AsyncClient(base_url=sim_url, timeout=10) as client:
        assert (await client.post("/_sim/reset")).status_code == 200
        yield client


async def stats(sim: httpx.AsyncClient) -> dict:
    return (await sim.get("/_sim/stats")).json()


async def test_the_engine_receives_the_exact_bytes(haru, sim):
    body = (
        b'{"model":"qwen-small",  "messages":[{"role":"user","content":"x"}],'
        b'"x_vendor":{"k":[1, 2]}}\n'
    )
    response = await haru.post(CHAT, content=body, headers={"authorization": "Bearer secret"})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("word0 word1")
    assert (await sim.get("/_sim/last-request", params={"raw": "1"})).content == body
    last = (await sim.get("/_sim/last-request")).json()
    assert last["path"] == CHAT
    assert "authorization" not in {name for name, _ in last["headers"]}


async def test_a_stream_arrives_chunk_by_chunk(haru, sim):
    body = chat_body(stream=True, max_tokens=40)
    async with haru.stream("POST", CHAT, content=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) == 43  # role, one per word, finish, [DONE]
    assert (await stats(sim))["completed"] == 1


async def test_client_disconnect_cancels_the_engine_request(haru, sim):
    async with haru.stream("POST", CHAT, content=chat_body(stream=True)) as response:
        assert (await anext(response.aiter_lines())).startswith("data: ")
    async with asyncio.timeout(10):  # only stops a broken test from hanging
        while (await stats(sim))["cancelled"] != 1:
            await asyncio.sleep(0.02)
    assert (await stats(sim))["completed"] == 0


async def test_nothing_a_client_sends_puts_the_engine_to_sleep(haru, sim):
    for model in ("../sleep", "qwen-small/../../sleep?level=1", "qwen-small#/wake_up"):
        assert (await haru.post(CHAT, content=chat_body(model))).status_code == 404
    for path in ("/sleep", "/wake_up", "/v1/chat/completions/../../sleep"):
        assert (await haru.post(path, content=chat_body())).status_code != 200
    assert (await haru.post(CHAT, content=chat_body())).status_code == 200
    after = await stats(sim)
    assert (after["sleeps"], after["wakes"], after["sleeping"]) == (0, 0, False)
    assert after["requests"] == 1
