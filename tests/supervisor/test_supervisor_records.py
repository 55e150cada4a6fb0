"""The state directory's records, process identity, the stateDir setting and lastCheckpointAt."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from common.strict_json import ConfigError
from supervisor.clock import SystemClock
from supervisor.config import TrainingSlotConfig, parse_config, state_dir_for
from supervisor.procfs import boot_id
from supervisor.records import ProcessStamp, ServerRecord, StateDir, StateDirBusy, TrainerRecord
from supervisor.training import TrainingSlot, newest_adapter_mtime, newest_checkpoint_mtime
from tests.supervisor.fakes import FakeSpawner

SLOTS = [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "qwen", "port": 8001}]}]


@pytest.fixture
def live_pid():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


# -- process identity --------------------------------------------------------------------------


def test_a_stamp_tells_the_original_process_from_a_reused_pid(live_pid):
    stamp = ProcessStamp.of(live_pid)
    assert stamp.pgid == live_pid and stamp.start_time and stamp.boot_id == boot_id()
    assert stamp.is_alive()
    assert not ProcessStamp(live_pid, live_pid, "1", stamp.boot_id).is_alive()
    assert not ProcessStamp(live_pid, live_pid, stamp.start_time, "another-boot").is_alive()
    # Without a start time nothing proves identity, so nothing is adopted.
    assert not ProcessStamp(live_pid, live_pid, None, stamp.boot_id).is_alive()


def test_a_stamp_of_an_exited_process_is_dead():
    proc = subprocess.Popen(["sleep", "30"])
    stamp = ProcessStamp.of(proc.pid)
    proc.kill()
    proc.wait()
    assert not stamp.is_alive()


# -- records -----------------------------------------------------------------------------------


def test_records_round_trip(tmp_path, live_pid):
    state = StateDir(tmp_path)
    stamp = ProcessStamp.of(live_pid)
    server = ServerRecord("org/model", 8001, "sha256:x", 1_700_000_000.5, stamp, True, None)
    trainer = TrainerRecord(2, ("python", "train.py"), 1_700_000_001.0, stamp)
    state.save(server)
    state.save(trainer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server-8001.json", "trainer-gpu2.json"]
    loaded = state.load()
    assert list(loaded.servers) == [server] and list(loaded.trainers) == [trainer]


def test_unreadable_records_and_unfinished_writes_are_deleted(tmp_path):
    (tmp_path / "server-1.json").write_text("{not json")
    (tmp_path / "server-2.json").write_text('{"version": 99, "kind": "server"}')
    (tmp_path / "server-3.json").write_text('{"version": 1, "kind": "server", "port": "x"}')
    (tmp_path / ".record-abc").write_text("half")
    (tmp_path / "notes.txt").write_text("not ours")
    loaded = StateDir(tmp_path).load()
    assert list(loaded.servers) == [] and list(loaded.trainers) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_dropping_leaves_a_record_that_names_a_newer_process(tmp_path, live_pid):
    state = StateDir(tmp_path)
    old = ServerRecord("qwen", 8001, None, 0.0, ProcessStamp(12345, 12345, "7", None))
    new = ServerRecord("qwen", 8001, None, 0.0, ProcessStamp.of(live_pid))
    state.save(new)
    state.drop(old)
    assert [r.stamp.pid for r in state.load().servers] == [live_pid]
    state.drop(new)
    assert list(tmp_path.glob("*.json")) == []


def test_a_missing_state_dir_loads_as_empty(tmp_path):
    loaded = StateDir(tmp_path / "nope").load()
    assert list(loaded.servers) == [] and list(loaded.trainers) == []


def test_two_supervisors_cannot_share_a_state_dir(tmp_path):
    first, second = StateDir(tmp_path / "s"), StateDir(tmp_path / "s")
    first.acquire()
    with pytest.raises(StateDirBusy):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


# -- the stateDir setting ----------------------------------------------------------------------


def test_state_dir_defaults_per_port_next_to_the_sim_state_or_under_var():
    cwd = Path("/srv/haru")
    nvml = parse_config({"slots": SLOTS}, cwd=cwd)
    assert state_dir_for(nvml, port=8701, cwd=cwd) == cwd / "var" / "supervisor-8701"
    sim = parse_config(
        {"gpu": {"backend": "sim", "simStateFile": "run/east/gpu.json"}, "slots": SLOTS}, cwd=cwd
    )
    assert state_dir_for(sim, port=8702, cwd=cwd) == cwd / "run" / "east" / "supervisor-8702"


def test_an_explicit_state_dir_wins_and_resolves_against_the_working_directory():
    cwd = Path("/srv/haru")
    config = parse_config({"stateDir": "state/east", "slots": SLOTS}, cwd=cwd)
    assert state_dir_for(config, port=8701, cwd=cwd) == cwd / "state" / "east"
    absolute = parse_config({"stateDir": "/var/lib/haru", "slots": SLOTS}, cwd=cwd)
    assert state_dir_for(absolute, port=8701, cwd=cwd) == Path("/var/lib/haru")


@pytest.mark.parametrize("value", ["", "  ", 3])
def test_state_dir_must_be_a_non_empty_string(value):
    with pytest.raises(ConfigError) as info:
        parse_config({"stateDir": value, "slots": SLOTS}, cwd=Path("/"))
    assert any(e.startswith("stateDir:") for e in info.value.errors)


# -- lastCheckpointAt --------------------------------------------------------------------------


def test_newest_checkpoint_is_the_newest_entry_but_never_a_write_in_progress(tmp_path):
    assert newest_checkpoint_mtime(tmp_path / "missing") is None
    assert newest_checkpoint_mtime(tmp_path) is None
    (tmp_path / "step-000001.json").write_text("{}")
    os.utime(tmp_path / "step-000001.json", (1_700_000_000, 1_700_000_000))
    (tmp_path / "checkpoint-500").mkdir()
    os.utime(tmp_path / "checkpoint-500", (1_700_000_100, 1_700_000_100))
    (tmp_path / ".step-tmp").write_text("half-written")
    os.utime(tmp_path / ".step-tmp", (1_800_000_000, 1_800_000_000))
    assert newest_checkpoint_mtime(tmp_path) == 1_700_000_100


def test_the_newest_adapter_is_the_newest_completion_marker_not_the_newest_checkpoint(tmp_path):
    """The control plane lists adapters when this moves: a periodic resume checkpoint, a torn
    adapter without its marker, or one still under its dot-name must not move it."""
    assert newest_adapter_mtime(tmp_path / "missing") is None
    (tmp_path / "step-000009").mkdir()
    assert newest_adapter_mtime(tmp_path) is None
    done = tmp_path / "adapter-000001"
    done.mkdir()
    (done / "haru-adapter.json").write_text("{}")
    os.utime(done / "haru-adapter.json", (1_700_000_000, 1_700_000_000))
    (tmp_path / "adapter-000002").mkdir()  # torn: no marker
    hidden = tmp_path / ".adapter-000003.tmp"
    hidden.mkdir()
    (hidden / "haru-adapter.json").write_text("{}")
    os.utime(tmp_path / "step-000009", (1_800_000_000, 1_800_000_000))
    assert newest_adapter_mtime(tmp_path) == 1_700_000_000


def test_training_status_reports_the_last_checkpoint_in_iso_utc(tmp_path):
    config = TrainingSlotConfig(0, ("train",), tmp_path / "ckpt", 1000)

    async def scenario():
        slot = TrainingSlot(config, spawner=FakeSpawner(), clock=SystemClock(), environ={})
        assert slot.describe()["lastCheckpointAt"] is None  # the dir does not exist yet
        config.checkpoint_dir.mkdir()
        ckpt = config.checkpoint_dir / "step-000010.json"
        ckpt.write_text("{}")
        os.utime(ckpt, (1_700_000_000.25, 1_700_000_000.25))
        assert slot.describe()["lastCheckpointAt"] == "2023-11-14T22:13:20.250000Z"

    asyncio.run(scenario())


def test_status_stays_cheap_with_many_checkpoints(tmp_path):
    for i in range(2000):
        (tmp_path / f"step-{i:06d}.json").write_text("")
    started = time.monotonic()
    assert newest_checkpoint_mtime(tmp_path) is not None
    assert time.monotonic() - started < 0.5
