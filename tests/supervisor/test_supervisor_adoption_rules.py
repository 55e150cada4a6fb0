"""Adoption rules, in process: a Host over scripted I/O, with real processes standing in for the
servers and trainers a crashed supervisor left behind (so /proc liveness is the real thing)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.config import parse_config
from supervisor.gpu.nvml import NvmlBackend
from supervisor.host import Host, HostDeps
from supervisor.procfs import pid_alive
from supervisor.records import ProcessStamp, ServerRecord, StateDir, TrainerRecord
from tests.supervisor.fakes import FakeModelServers, FakeNvml, FakeServerState, FakeSpawner

QWEN_PORT, LLAMA_PORT = 18001, 18002


class FastClock:
    """Real time, but backoff pauses are cut short so restarts happen at once."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(min(max(seconds, 0.0), 0.01))


def config(engine: str = "sim", *, training: bool = True) -> dict[str, Any]:
    profile: dict[str, Any] = {"engine": engine}
    if engine == "sglang":
        profile["modelPath"] = "Qwen/Qwen2.5-7B"
    slots: list[dict[str, Any]] = [
        {
            "kind": "inference",
            "gpuIndex": 0,
            "models": [
                {"name": "qwen-small", "port": QWEN_PORT, "profile": profile},
                {"name": "llama-small", "port": LLAMA_PORT, "profile": profile},
            ],
        }
    ]
    if training:
        slots.append(
            {
                "kind": "training",
                "gpuIndex": 0,
                "command": ["train"],
                "checkpointDir": "ckpt",
                "graceMs": 5000,
            }
        )
    return {"slots": slots}


class Harness:
    def __init__(self, tmp: Path, data: dict[str, Any], servers: dict[int, FakeServerState]):
        self.state = StateDir(tmp / "state")
        self.spawner = FakeSpawner()
        self.servers = FakeModelServers(servers)
        transport = httpx.MockTransport(self.servers)

        async def never_in_use(port: int) -> bool:
            return False

        self.host = Host(
            parse_config(data, cwd=tmp),
            HostDeps(
                gpu=NvmlBackend(load=lambda: FakeNvml([])),
                spawner=self.spawner,
                clock=FastClock(),
                environ={"PATH": "/usr/bin"},
                http_factory=lambda: httpx.AsyncClient(transport=transport),
                port_in_use=never_in_use,
                state=self.state,
            ),
        )

    async def models(self) -> dict[str, dict[str, Any]]:
        status = await self.host.status()
        return {m["name"]: m for s in status["slots"] for m in s.get("models", ())}

    def record_files(self) -> dict[str, dict[str, Any]]:
        return {p.name: json.loads(p.read_text()) for p in self.state.path.glob("*.json")}


def servers(sleeping: bool = False) -> dict[int, FakeServerState]:
    return {
        QWEN_PORT: FakeServerState("qwen-small", sleeping=sleeping),
        LLAMA_PORT: FakeServerState("llama-small", sleeping=sleeping),
    }


def server_record(pid: int, name="qwen-small", port=QWEN_PORT, **kwargs) -> ServerRecord:
    fields: dict[str, Any] = {"fingerprint": "sha256:recorded", "started_at": time.time() - 60}
    fields.update(kwargs)
    return ServerRecord(name=name, port=port, stamp=ProcessStamp.of(pid), **fields)


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.01)


@pytest.fixture
def stand_in(processes, tools):
    """Start a real, harmless process that plays a leftover server or trainer."""

    def start() -> int:
        return processes.start(["sleep", "30"], env=tools.child_env()).pid

    return start


def test_an_adopted_server_keeps_the_fingerprint_it_was_started_with(tmp_path, stand_in):
    pid = stand_in()
    h = Harness(tmp_path, config(training=False), servers())
    h.state.save(server_record(pid, fingerprint="sha256:from-an-older-profile"))

    async def scenario():
        await h.host.start()
        qwen = (await h.models())["qwen-small"]
        # The config's profile says otherwise; reporting the truth is what lets the control
        # plane flag the drift.
        assert qwen["fingerprint"] == "sha256:from-an-older-profile"
        assert qwen["process"]["pid"] == pid and qwen["process"]["adopted"] is True
        await until(lambda: len(h.spawner.spawned) == 1)
        (spawned,) = h.spawner.spawned
        assert spawned.argv[spawned.argv.index("--model") + 1] == "llama-small"
        await h.host.shutdown()
        assert not pid_alive(pid)
        assert h.record_files() == {}

    asyncio.run(scenario())


def test_an_adopted_server_that_dies_is_restarted_and_put_back_to_sleep(tmp_path, stand_in):
    pid = stand_in()
    fake = servers(sleeping=True)
    h = Harness(tmp_path, config(training=False), fake)
    h.state.save(server_record(pid, want_asleep=True, sleeping=True))

    async def scenario():
        await h.host.start()
        assert (await h.models())["qwen-small"]["sleeping"] is True
        fake[QWEN_PORT].sleeping = False  # the replacement process comes up awake
        os.killpg(pid, signal.SIGKILL)
        await until(lambda: len(h.spawner.spawned) == 2)
        await until(lambda: fake[QWEN_PORT].sleeping is True)
        assert "POST /sleep" in fake[QWEN_PORT].calls
        qwen = (await h.models())["qwen-small"]
        assert qwen["process"]["adopted"] is False and qwen["process"]["restarts"] == 1
        assert "unknown status" in (qwen["process"]["lastError"] or "")
        saved = h.record_files()[f"server-{QWEN_PORT}.json"]
        assert saved["pid"] == qwen["process"]["pid"] and saved["wantAsleep"] is True
        await h.host.shutdown()

    asyncio.run(scenario())


def test_sglang_sleep_state_of_an_adopted_server_comes_from_its_record(tmp_path, stand_in):
    h = Harness(tmp_path, config("sglang", training=False), servers())
    h.state.save(server_record(stand_in(), want_asleep=True, sleeping=True))
    h.state.save(server_record(stand_in(), name="llama-small", port=LLAMA_PORT))

    async def scenario():
        await h.host.start()
        models = await h.models()
        assert models["qwen-small"]["sleeping"] is True
        # No status endpoint and nothing recorded: unknown, never assumed awake.
        assert models["llama-small"]["sleeping"] is None
        assert "adopted" in models["llama-small"]["error"]
        ready, known, _ = await h.host.readiness()
        assert ready is False and known is False
        await h.host.wake(None)
        assert all(m["sleeping"] is False for m in (await h.models()).values())
        await h.host.shutdown()

    asyncio.run(scenario())


def test_an_adopted_trainer_is_stopped_by_the_normal_stop_path(tmp_path, stand_in):
    pid = stand_in()
    h = Harness(tmp_path, config(), servers())
    h.state.save(TrainerRecord(0, ("train",), time.time() - 5, ProcessStamp.of(pid)))

    async def scenario():
        await h.host.start()
        (slot,) = h.host.training_status()
        assert slot["state"] == "running" and slot["pids"] == [pid] and slot["adopted"] is True
        assert (await h.host.training_start())[0]["pids"] == [pid]  # already running: no spawn
        assert not any(child.argv == ("train",) for child in h.spawner.spawned)
        await h.host.training_stop(None)
        assert await h.host.training[0].wait_idle(5)
        (slot,) = h.host.training_status()
        assert slot["state"] == "idle" and slot["killed"] is False
        assert slot["lastExitCode"] is None  # not our child: init collected its status
        assert "trainer-gpu0.json" not in h.record_files()
        await h.host.shutdown()

    asyncio.run(scenario())


def test_leftovers_the_config_no_longer_has_are_stopped(tmp_path, stand_in):
    server_pid, trainer_pid = stand_in(), stand_in()
    h = Harness(tmp_path, config(training=False), servers())
    h.state.save(server_record(server_pid, name="retired-model", port=18099))
    h.state.save(TrainerRecord(0, ("train",), time.time(), ProcessStamp.of(trainer_pid)))

    async def scenario():
        await h.host.start()
        await until(lambda: not pid_alive(server_pid) and not pid_alive(trainer_pid))
        await until(lambda: set(h.record_files()) == {f"server-{p}.json" for p in (18001, 18002)})
        await h.host.shutdown()

    asyncio.run(scenario())


def test_records_follow_the_processes_the_supervisor_starts(tmp_path):
    h = Harness(tmp_path, config(), servers())

    async def scenario():
        await h.host.start()
        await until(lambda: len(h.spawner.spawned) == 2)
        await h.host.training_start()
        files = h.record_files()
        assert set(files) == {"server-18001.json", "server-18002.json", "trainer-gpu0.json"}
        qwen = files["server-18001.json"]
        assert qwen["name"] == "qwen-small" and qwen["fingerprint"].startswith("sha256:")
        assert qwen["pid"] == qwen["pgid"] == h.spawner.spawned[0].pid
        assert files["trainer-gpu0.json"]["command"] == ["train"]
        await h.host.sleep(None)
        assert h.record_files()["server-18001.json"]["sleeping"] is True
        await h.host.training_stop(100)
        assert await h.host.training[0].wait_idle(5)
        assert "trainer-gpu0.json" not in h.record_files()
        await h.host.shutdown()
        assert h.record_files() == {}

    asyncio.run(scenario())
