"""A real supervisor swaps a real simulated engine to a new profile, then crashes and is replaced.

Real processes throughout: the new server answers with the new profile's reply on its new port,
the old process is gone, and the supervisor started after a SIGKILL adopts the swapped server
(not the config's old profile) from its state dir.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from supervisor.gpu.sim_state import pid_alive

pytestmark = pytest.mark.integration


def sim_profile(reply: str) -> dict:
    return {
        "engine": "sim",
        "extraArgs": ["--weights-mib", "1000", "--context-mib", "10", "--reply", reply],
    }


def model_of(client: httpx.Client) -> dict:
    return client.get("/v1/status").json()["slots"][0]["models"][0]


def answer(port: int) -> str:
    body = {"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=10)
    content: str = reply.json()["choices"][0]["message"]["content"]
    return content


def test_a_swapped_server_serves_the_new_profile_and_survives_a_supervisor_crash(
    processes, tools, tmp_path: Path
):
    old_port, new_port = tools.free_port(), tools.free_port()
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "gpu.json")},
        "swapPorts": {"first": new_port, "last": new_port},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [{"name": "qwen-small", "port": old_port, "profile": sim_profile("v1")}],
            }
        ],
    }
    first = tools.start_supervisor(processes, config)
    with first.client() as client:
        old_pid = model_of(client)["process"]["pid"]
        assert answer(old_port) == "v1"
        body = {"model": "qwen-small", "mode": "new-port", "profile": sim_profile("v2")}
        started = client.post("/v1/models/swap", json=body)
        assert started.status_code == 202 and started.json()["port"] == new_port
        tools.wait_for(lambda: model_of(client).get("swap", {}).get("state") == "switched")
        swapped = model_of(client)
        new_pid = swapped["process"]["pid"]
        processes.adopt(new_pid)
        assert swapped["port"] == new_port and swapped["sleeping"] is False
        assert answer(new_port) == "v2"
        tools.wait_for(lambda: not pid_alive(old_pid))

    # A crash: the supervisor alone dies; the swapped server keeps running.
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=10)
    assert pid_alive(new_pid)

    second = tools.start_supervisor(processes, config, port=first.port)
    with second.client() as client:
        after = model_of(client)
        assert after["port"] == new_port
        assert after["process"]["pid"] == new_pid and after["process"]["adopted"] is True
        assert after["swap"]["state"] == "switched" and after["swap"]["recorded"] is True
        assert answer(new_port) == "v2"
        # The config's old port stays free: nothing started the old profile again.
        with pytest.raises(httpx.ConnectError):
            answer(old_port)

    os.kill(second.proc.pid, signal.SIGTERM)
    assert second.proc.wait(timeout=20) == 0
    assert not pid_alive(new_pid)
    # The swap outlives the processes: the next start runs the swapped profile again.
    assert len(list((tmp_path / f"supervisor-{first.port}").glob("swap-*.json"))) == 1


def test_an_in_place_swap_reuses_the_port_of_the_stopped_server(processes, tools, tmp_path: Path):
    port = tools.free_port()
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "gpu.json")},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [{"name": "qwen-small", "port": port, "profile": sim_profile("v1")}],
            }
        ],
    }
    sup = tools.start_supervisor(processes, config)
    with sup.client() as client:
        old_pid = model_of(client)["process"]["pid"]
        body = {"model": "qwen-small", "mode": "in-place", "profile": sim_profile("v2")}
        assert client.post("/v1/models/swap", json=body).json()["port"] == port
        tools.wait_for(lambda: model_of(client).get("swap", {}).get("state") == "switched")
        swapped = model_of(client)
        processes.adopt(swapped["process"]["pid"])
        assert not pid_alive(old_pid)
        assert swapped["port"] == port and answer(port) == "v2"
        assert client.get("/v1/ready").json()["ready"] is True
