"""The supervisor's own shutdown: refuse new work, stop trainers within a bounded grace."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

import supervisor.host as host_module
from supervisor.config import parse_config
from supervisor.gpu.nvml import NvmlBackend
from supervisor.host import Host, HostDeps, ShuttingDown
from tests.supervisor.fakes import FakeNvml, FakeSpawner

CONFIG = {
    "slots": [
        {
            "kind": "training",
            "gpuIndex": 0,
            "command": ["train"],
            "checkpointDir": "/tmp/haru-shutdown-ck",
            "graceMs": 600_000,
        }
    ]
}


def make_host(spawner: FakeSpawner) -> Host:
    return Host(
        parse_config(CONFIG, cwd=Path("/")),
        HostDeps(gpu=NvmlBackend(load=lambda: FakeNvml([])), spawner=spawner, environ={}),
    )


def test_shutdown_caps_the_trainers_grace_and_kills_a_stubborn_one(monkeypatch):
    # The config allows ten minutes; a shutting-down host caps it (30 s, here shortened).
    monkeypatch.setattr(host_module, "SHUTDOWN_TRAINING_GRACE_MS", 150)

    async def scenario():
        spawner = FakeSpawner(obeys_term=False)
        host = make_host(spawner)
        await host.training_start()
        started = time.monotonic()
        await asyncio.wait_for(host.shutdown(), 5)
        assert time.monotonic() - started < 1.0
        assert spawner.spawned[0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]
        assert host.training_status()[0]["state"] == "idle"

    asyncio.run(scenario())


def test_no_training_starts_once_shutdown_began():
    async def scenario():
        host = make_host(FakeSpawner())
        host.begin_shutdown()
        with pytest.raises(ShuttingDown):
            await host.training_start()
        await host.shutdown()

    asyncio.run(scenario())


def test_kill_now_sigkills_every_child_group():
    async def scenario():
        spawner = FakeSpawner(obeys_term=False)
        host = make_host(spawner)
        await host.training_start()
        host.kill_now()
        assert spawner.spawned[0].signals == [signal.SIGKILL]
        await host.shutdown()

    asyncio.run(scenario())
