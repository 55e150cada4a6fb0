"""The fleet farm (supervisor/farm): many simulated hosts in one process, each answering the
wire contract on its own port with its own token, and the faults a benchmark injects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from common.farm_manifest import HostPlan, plan_hosts, read_manifest, write_manifest
from common.ports import free_port
from common.wire.contract import check_response
from supervisor.farm.control import Farm


async def checked(response: httpx.Response) -> None:
    """Every supervisor answer of these tests is checked against the wire contract's schemas."""
    await response.aread()
    check_response(response)


def supervisor(host: HostPlan, token: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=host.url,
        headers={"Authorization": f"Bearer {token or host.token}"},
        timeout=10,
        trust_env=False,
        event_hooks={"response": [checked]},
    )


@pytest.fixture
async def farm(tmp_path: Path) -> AsyncIterator[tuple[Farm, list[HostPlan], str]]:
    plans = plan_hosts(3, asleep=lambda i: i == 1)
    running = Farm(plans, workdir=tmp_path)
    port = free_port()
    await running.start(port)
    try:
        yield running, plans, f"http://127.0.0.1:{port}"
    finally:
        await running.close()


async def fault(control: str, name: str, **body: object) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        return await c.post(f"{control}/farm/hosts/{name}/fault", json=body)


async def test_every_route_of_every_host_answers_the_wire_contract(farm):
    _, plans, _ = farm
    for host in plans:
        async with supervisor(host) as c:
            status = (await c.get("/v1/status")).json()
            assert status["host"] == host.name
            assert status["stateKnown"] is True
            models = status["slots"][0]["models"]
            assert [m["port"] for m in models] == [m.port for m in host.models]
            assert (await c.get("/v1/ready")).status_code == 200
            assert (await c.get("/v1/gpu/memory")).json()["backend"] == "sim"
            assert (await c.get("/v1/training/status")).status_code == 200
            assert (await c.post("/v1/vllm/sleep", json={})).json()["ok"] is True
            assert (await c.get("/v1/status")).json()["notReady"] == [
                f"{m.name}: asleep" for m in host.models
            ]
            assert (await c.post("/v1/vllm/wake", json={})).json()["ok"] is True
            probe = (await c.post("/v1/probe", json={"prompt": "ping"})).json()
            assert probe["ok"] is True
            assert len(probe["results"]) == len(host.models)


async def test_a_standby_host_starts_asleep_and_its_models_serve_after_a_wake(farm):
    _, plans, _ = farm
    standby = plans[1]
    async with supervisor(standby) as c:
        assert (await c.get("/v1/ready")).json()["ready"] is False
        await c.post("/v1/vllm/wake", json={})
    body = {"model": "qwen-small", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.post(f"{standby.serving_url('qwen-small')}/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert "qwen-small" in r.json()["choices"][0]["message"]["content"]


async def test_each_host_requires_its_own_token(farm):
    _, plans, _ = farm
    a, b = plans[0], plans[1]
    async with supervisor(a, token=b.token) as c:
        refused = await c.get("/v1/status")
    assert refused.status_code == 401
    async with httpx.AsyncClient(base_url=a.url, trust_env=False) as c:
        assert (await c.get("/v1/status")).status_code == 401
        assert (await c.get("/healthz")).status_code == 200


async def test_a_crashed_host_refuses_connections_until_restored(farm):
    _, plans, control = farm
    host = plans[0]
    assert (await fault(control, host.name, fault="crash")).json()["supervisor"][
        "listening"
    ] is False
    async with supervisor(host) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get("/v1/status")
    async with httpx.AsyncClient(trust_env=False) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"{host.serving_url('qwen-small')}/health")
    # The other hosts are untouched.
    async with supervisor(plans[2]) as c:
        assert (await c.get("/v1/status")).status_code == 200
    await fault(control, host.name, fault="none")
    async with supervisor(host) as c:
        assert (await c.get("/v1/status")).json()["stateKnown"] is True


async def test_a_partitioned_host_accepts_and_never_answers(farm):
    _, plans, control = farm
    host = plans[0]
    await fault(control, host.name, fault="partition", target="supervisor")
    async with supervisor(host) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get("/v1/status", timeout=httpx.Timeout(10, read=0.5))
    await fault(control, host.name, fault="none")


async def test_crashed_models_leave_the_supervisor_unsure_of_their_state(farm):
    _, plans, control = farm
    host = plans[2]
    await fault(control, host.name, fault="crash", target="models")
    async with supervisor(host) as c:
        status = (await c.get("/v1/status")).json()
    assert status["stateKnown"] is False
    assert status["ready"] is False


async def test_a_slow_host_answers_late(farm):
    _, plans, control = farm
    host = plans[0]
    await fault(control, host.name, fault="slow", target="supervisor", slowMs=400)
    async with supervisor(host) as c:
        started = time.monotonic()
        assert (await c.get("/v1/status")).status_code == 200
        assert time.monotonic() - started >= 0.4


async def test_the_sims_own_crash_fault_stops_that_engine_not_the_farm(farm):
    running, plans, _ = farm
    host = plans[0]
    url = host.serving_url("llama-small")
    async with httpx.AsyncClient(trust_env=False, timeout=5) as c:
        assert (await c.post(f"{url}/_sim/faults", json={"crash": True})).status_code == 200
        await asyncio.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            await c.get(f"{url}/health")
        assert (await c.get(f"{host.serving_url('qwen-small')}/health")).status_code == 200
    assert running.hosts[host.name].describe()["models"][0]["listening"] is False


async def test_bad_fault_requests_change_nothing(farm):
    _, plans, control = farm
    name = plans[0].name
    assert (await fault(control, name, fault="melt")).status_code == 400
    assert (await fault(control, name, fault="crash", target="gpu")).status_code == 400
    assert (await fault(control, name, fault="slow", slowMs=-1)).status_code == 400
    assert (await fault(control, "nobody", fault="crash")).status_code == 404
    async with supervisor(plans[0]) as c:
        assert (await c.get("/v1/status")).status_code == 200


async def test_heartbeats_are_recorded_per_host(farm):
    _, plans, control = farm
    async with supervisor(plans[1]) as c:
        await c.get("/v1/status")
        await c.get("/v1/ready")
    async with httpx.AsyncClient(trust_env=False) as c:
        heard = (await c.get(f"{control}/farm/heartbeats")).json()
    assert len(heard["hosts"][plans[1].name]) == 1
    assert heard["hosts"][plans[0].name] == []
    assert heard["now"] >= heard["hosts"][plans[1].name][0]


def test_the_manifest_round_trips_and_is_private(tmp_path: Path):
    plans = plan_hosts(4, asleep=lambda i: i % 2 == 1)
    ports = [p.port for p in plans] + [m.port for p in plans for m in p.models]
    assert len(set(ports)) == len(ports)
    assert len({p.token for p in plans}) == 4
    # One loopback address of the farm's own, never 127.0.0.1 (where everybody else listens).
    assert len({p.address for p in plans}) == 1
    assert plans[0].url.startswith(f"http://{plans[0].address}:")
    assert plans[0].address.startswith("127.") and plans[0].address != "127.0.0.1"
    path = tmp_path / "farm.json"
    write_manifest(path, plans)
    assert path.stat().st_mode & 0o077 == 0
    assert read_manifest(path) == plans


def test_a_manifest_that_is_not_one_is_refused_by_name(tmp_path: Path):
    path = tmp_path / "farm.json"
    path.write_text('{"hosts": [{"name": "h0"}]}')
    with pytest.raises(ValueError, match="not a farm manifest"):
        read_manifest(path)
    with pytest.raises(ValueError, match="hosts must be"):
        plan_hosts(0)
    [host] = plan_hosts(1)
    write_manifest(path, [replace(host, address="10.0.0.7")])
    with pytest.raises(ValueError, match="not a loopback address"):
        read_manifest(path)
