"""Training slots: start, SIGTERM then SIGKILL at a deadline that only ever moves earlier."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from supervisor.clock import SystemClock
from supervisor.config import TrainingSlotConfig
from supervisor.gpu.sim_state import SimGpuState
from supervisor.processes import AsyncioSpawner
from supervisor.sim.trainer import newest_step, write_checkpoint
from supervisor.training import IDLE, RUNNING, STOPPING, SpawnFailed, TrainingBusy, TrainingSlot
from tests.supervisor.fakes import FakeSpawner

PARENT_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HARU_SUPERVISOR_TOKEN": "tok-should-never-leak",
    "HARU_SUPERVISOR_CONFIG": '{"slots": []}',
}


def slot_config(tmp_path: Path, command=("train",), grace_ms=30_000, gpu=1) -> TrainingSlotConfig:
    return TrainingSlotConfig(
        gpu_index=gpu, command=tuple(command), checkpoint_dir=tmp_path / "ckpt", grace_ms=grace_ms
    )


def make_slot(tmp_path, spawner, **kwargs) -> TrainingSlot:
    return TrainingSlot(
        slot_config(tmp_path, **kwargs), spawner=spawner, clock=SystemClock(), environ=PARENT_ENV
    )


async def wait_idle(slot: TrainingSlot, timeout: float = 5.0) -> float:
    started = time.monotonic()
    assert await slot.wait_idle(timeout), f"still {slot.state}"
    return time.monotonic() - started


# -- with a scripted spawner ------------------------------------------------------------------


def test_start_spawns_the_command_exactly_and_is_idempotent(tmp_path):
    async def scenario():
        spawner = FakeSpawner()
        slot = make_slot(tmp_path, spawner, command=("python", "-m", "train", "--lr", "1e-4"))
        await slot.start()
        await slot.start()
        assert len(spawner.spawned) == 1
        child = spawner.spawned[0]
        assert child.argv == ("python", "-m", "train", "--lr", "1e-4")
        assert slot.state == RUNNING and slot.describe()["pids"] == [child.pid]
        assert (tmp_path / "ckpt").is_dir()
        slot.stop(100)
        await wait_idle(slot)

    asyncio.run(scenario())


def test_child_environment_adds_the_contract_and_drops_the_secrets(tmp_path):
    async def scenario():
        spawner = FakeSpawner()
        slot = make_slot(tmp_path, spawner)
        await slot.start()
        env = spawner.spawned[0].env
        added = {k: v for k, v in env.items() if k not in PARENT_ENV}
        assert added == {
            "HARU_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "HARU_GPU_INDEX": "1",
            "CUDA_VISIBLE_DEVICES": "1",
            # Else CUDA's fastest-first numbering can pin another card than NVML's index 1.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        assert "HARU_SUPERVISOR_TOKEN" not in env and "HARU_SUPERVISOR_CONFIG" not in env
        assert env["PATH"] == PARENT_ENV["PATH"]
        slot.stop(0)
        await wait_idle(slot)

    asyncio.run(scenario())


def test_stop_sends_sigterm_and_a_cooperative_trainer_exits(tmp_path):
    async def scenario():
        spawner = FakeSpawner(obeys_term=True)
        slot = make_slot(tmp_path, spawner)
        await slot.start()
        slot.stop(5000)
        await wait_idle(slot)
        child = spawner.spawned[0]
        assert child.signals[0] == signal.SIGTERM
        assert slot.killed is False and slot.last_exit_code == 0 and slot.state == IDLE

    asyncio.run(scenario())


def test_a_trainer_ignoring_sigterm_is_killed_at_the_deadline(tmp_path):
    async def scenario():
        spawner = FakeSpawner(obeys_term=False)
        slot = make_slot(tmp_path, spawner)
        await slot.start()
        slot.stop(150)
        assert slot.state == STOPPING
        elapsed = await wait_idle(slot)
        assert 0.1 <= elapsed < 0.6
        assert spawner.spawned[0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]
        assert slot.killed is True

    asyncio.run(scenario())


def test_a_later_stop_can_shorten_the_deadline(tmp_path):
    async def scenario():
        slot = make_slot(tmp_path, FakeSpawner(obeys_term=False))
        await slot.start()
        slot.stop(10_000)
        await asyncio.sleep(0.05)
        slot.stop(100)
        assert await wait_idle(slot) < 0.6

    asyncio.run(scenario())


def test_a_later_stop_never_lengthens_the_deadline(tmp_path):
    async def scenario():
        slot = make_slot(tmp_path, FakeSpawner(obeys_term=False))
        await slot.start()
        slot.stop(150)
        slot.stop(10_000)
        assert await wait_idle(slot) < 0.6

    asyncio.run(scenario())


def test_default_grace_comes_from_the_config(tmp_path):
    async def scenario():
        slot = make_slot(tmp_path, FakeSpawner(obeys_term=False), grace_ms=120)
        await slot.start()
        slot.stop()
        assert await wait_idle(slot) < 0.6

    asyncio.run(scenario())


def test_spawn_failure_returns_the_slot_to_idle_with_the_error(tmp_path):
    async def scenario():
        error = FileNotFoundError(2, "No such file or directory", "train")
        slot = make_slot(tmp_path, FakeSpawner(fail_with=error))
        with pytest.raises(SpawnFailed):
            await slot.start()
        status = slot.describe()
        assert status["state"] == "idle" and status["pids"] == []
        assert "spawn failed" in status["lastError"] and "No such file" in status["lastError"]

    asyncio.run(scenario())


def test_start_while_stopping_is_refused_until_idle(tmp_path):
    async def scenario():
        slot = make_slot(tmp_path, FakeSpawner(obeys_term=False))
        await slot.start()
        slot.stop(200)
        with pytest.raises(TrainingBusy):
            await slot.start()
        await wait_idle(slot)
        await slot.start()
        assert slot.state == RUNNING
        slot.stop(0)
        await wait_idle(slot)

    asyncio.run(scenario())


def test_a_trainer_that_exits_by_itself_leaves_the_slot_idle(tmp_path):
    async def scenario():
        spawner = FakeSpawner()
        slot = make_slot(tmp_path, spawner)
        await slot.start()
        spawner.spawned[0].exit(3)
        await wait_idle(slot)
        assert slot.describe()["lastExitCode"] == 3
        assert slot.describe()["lastError"] == "trainer exited with code 3"

    asyncio.run(scenario())


def test_stop_on_an_idle_slot_is_a_no_op(tmp_path):
    async def scenario():
        slot = make_slot(tmp_path, FakeSpawner())
        slot.stop(10)
        assert slot.state == IDLE

    asyncio.run(scenario())


# -- checkpoints of the simulated trainer -----------------------------------------------------


def test_sim_trainer_resumes_from_the_newest_readable_checkpoint(tmp_path):
    assert newest_step(tmp_path) == 0
    write_checkpoint(tmp_path, 5, "periodic")
    write_checkpoint(tmp_path, 12, "periodic")
    assert newest_step(tmp_path) == 12
    (tmp_path / "step-000020.json").write_text("{torn")
    assert newest_step(tmp_path) == 12
    for step in range(13, 20):
        write_checkpoint(tmp_path, step, "periodic")
    assert len(list(tmp_path.glob("step-*.json"))) <= 4


# -- with real processes ----------------------------------------------------------------------


def sim_trainer(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "supervisor.sim.trainer", "--step-s", "0.02", *args)


def real_slot(tmp_path: Path, command, grace_ms=30_000, environ=None) -> TrainingSlot:
    return TrainingSlot(
        slot_config(tmp_path, command=command, grace_ms=grace_ms, gpu=0),
        spawner=AsyncioSpawner(),
        clock=SystemClock(),
        environ=environ or {**PARENT_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        host_env={"HARU_SIM_GPU_STATE": str(tmp_path / "gpu.json")},
    )


async def until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met")


@pytest.mark.integration
def test_real_trainer_ignoring_sigterm_is_killed_within_grace_and_frees_its_memory(tmp_path):
    state = SimGpuState(tmp_path / "gpu.json")

    async def scenario():
        slot = real_slot(tmp_path, sim_trainer("--ignore-sigterm", "--memory-mib", "30000"))
        try:
            await slot.start()
            await until(lambda: state.used_mib(0) == 30000)
            started = time.monotonic()
            slot.stop(1000)
            assert await slot.wait_idle(5)
            elapsed = time.monotonic() - started
            assert 1.0 <= elapsed <= 1.5, elapsed
            assert slot.killed is True
            assert slot.last_exit_code == -signal.SIGKILL
            assert state.used_mib(0) == 0
        finally:
            slot.kill_now()

    asyncio.run(scenario())


@pytest.mark.integration
def test_real_trainer_saves_on_sigterm_and_exits_by_itself(tmp_path):
    gpu_state = SimGpuState(tmp_path / "gpu.json")

    def training(pid: int | None) -> bool:
        # The trainer takes its simulated memory right after its SIGTERM handler is in place
        # and just before its first step: from then on a stop is saved, however slowly the
        # machine started the process.
        return any(h.pid == pid and h.label == "trainer" for h in gpu_state.holders())

    async def scenario():
        slot = real_slot(
            tmp_path,
            sim_trainer(
                "--sigterm-save-s", "0.1", "--memory-mib", "10", "--checkpoint-every-s", "0.2"
            ),
        )
        try:
            await slot.start()
            await until(lambda: training(slot.pid))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            slot.stop(10_000)
            assert await slot.wait_idle(5)
            assert time.monotonic() - started < 2.0
            assert slot.killed is False and slot.last_exit_code == 0
            checkpoints = sorted((tmp_path / "ckpt").glob("step-*.json"))
            assert checkpoints, "no checkpoint on disk"
            saved = json.loads(checkpoints[-1].read_text())
            assert saved["reason"] == "sigterm" and saved["step"] > 0
            # The next run resumes from it. Waiting for its first step past the saved one (not
            # a fixed sleep) keeps this true on a loaded machine, where a fresh Python process
            # may take longer than a few hundred milliseconds to take a step.
            await slot.start()
            await until(lambda: training(slot.pid))
            deadline = time.monotonic() + 15
            while newest_step(tmp_path / "ckpt") <= saved["step"]:
                assert time.monotonic() < deadline, "the resumed trainer made no progress"
                await asyncio.sleep(0.05)
            slot.stop(10_000)
            assert await slot.wait_idle(5)
            assert newest_step(tmp_path / "ckpt") > saved["step"]
        finally:
            slot.kill_now()

    asyncio.run(scenario())


@pytest.mark.integration
def test_real_trainer_environment_holds_exactly_the_contract_and_no_token(tmp_path):
    dump = tmp_path / "env.json"
    parent = {**PARENT_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    async def scenario():
        slot = TrainingSlot(
            slot_config(tmp_path, command=sim_trainer("--dump-env", str(dump)), gpu=0),
            spawner=AsyncioSpawner(),
            clock=SystemClock(),
            environ=parent,
        )
        try:
            await slot.start()
            # Written with one write_text: wait for the content, not just the file (a SIGTERM
            # between create and write leaves it empty on a loaded machine).
            await until(lambda: dump.exists() and dump.read_text().endswith("}"))
            slot.stop(5000)
            assert await slot.wait_idle(5)
        finally:
            slot.kill_now()

    asyncio.run(scenario())
    env = json.loads(dump.read_text())
    added = set(env) - set(parent)
    assert added == {
        "HARU_CHECKPOINT_DIR",
        "HARU_GPU_INDEX",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    }
    assert env["HARU_CHECKPOINT_DIR"] == str(tmp_path / "ckpt")
    assert env["HARU_GPU_INDEX"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "HARU_SUPERVISOR_TOKEN" not in env and "HARU_SUPERVISOR_CONFIG" not in env
    assert "tok-should-never-leak" not in json.dumps(env)


def test_real_trainer_never_inherits_anything_named_like_a_secret(tmp_path):
    dump = tmp_path / "env.json"
    secrets = {
        "HARU_API_TOKEN": "api-tok",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "PGPASSWORD": "pg-pass",
        "openai_api_key": "lower-case-key",
        # Under names no deny-list knows (issue 29).
        "DATABASE_URL": "postgres://haru:db-pass-4821@db.internal/haru",
        "HTTPS_PROXY": "http://proxy-user:proxy-pass-553@proxy.internal:3128",
        "SECRET_THING": "thing-7731",
    }
    parent = {
        **PARENT_ENV,
        **secrets,
        "HF_TOKEN": "hf-allowed",
        "HARU_CHILD_ENV_ALLOW": "HF_TOKEN",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }

    async def scenario():
        slot = TrainingSlot(
            slot_config(tmp_path, command=sim_trainer("--dump-env", str(dump)), gpu=0),
            spawner=AsyncioSpawner(),
            clock=SystemClock(),
            environ=parent,
        )
        try:
            await slot.start()
            await until(lambda: dump.exists() and dump.read_text().endswith("}"))
            slot.stop(5000)
            assert await slot.wait_idle(5)
        finally:
            slot.kill_now()

    asyncio.run(scenario())
    text = dump.read_text()
    env = json.loads(text)
    for name, value in secrets.items():
        assert name not in env and value not in text
    assert env["HF_TOKEN"] == "hf-allowed"  # let through by name, on purpose
    assert env["PATH"] == PARENT_ENV["PATH"]
