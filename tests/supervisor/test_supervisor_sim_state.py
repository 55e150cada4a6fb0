"""The simulated GPUs' shared state file: per-pid holdings, released when a process dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

from supervisor.gpu.sim_state import SimGpuState, pid_alive


def test_hold_replace_and_release(tmp_path):
    state = SimGpuState(tmp_path / "gpu.json")
    state.hold(0, 6000, "weights:qwen")
    state.hold(0, 500, "context:qwen")
    state.hold(1, 100, "weights:other")
    assert state.used_mib(0) == 6500 and state.used_mib(1) == 100
    state.hold(0, 0, "weights:qwen")  # asleep: weights freed, context kept
    assert state.used_mib(0) == 500
    state.release()
    assert state.holders() == []


def test_a_killed_process_releases_its_memory(tmp_path):
    state = SimGpuState(tmp_path / "gpu.json")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        state.hold(0, 4000, "trainer", pid=proc.pid)
        assert state.used_mib(0) == 4000
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert state.used_mib(0) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_holds_no_memory(tmp_path):
    state = SimGpuState(tmp_path / "gpu.json")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        state.hold(0, 4000, "trainer", pid=proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        # Not reaped yet: the kernel already freed its memory, so must the simulation.
        for _ in range(200):
            if not pid_alive(proc.pid):
                break
            threading.Event().wait(0.01)
        assert state.used_mib(0) == 0
    finally:
        proc.wait()


def test_a_reused_pid_does_not_inherit_an_old_holding(tmp_path):
    path = tmp_path / "gpu.json"
    holder = {"pid": os.getpid(), "gpuIndex": 0, "label": "old", "mib": 7, "startTime": "1"}
    path.write_text(json.dumps({"version": 1, "holders": [holder]}))
    assert SimGpuState(path).holders() == []


def test_concurrent_writers_do_not_lose_updates(tmp_path):
    state_path = tmp_path / "gpu.json"

    def writer(i: int) -> None:
        for j in range(10):
            SimGpuState(state_path).hold(0, 1, f"w{i}-{j}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert SimGpuState(state_path).used_mib(0) == 60


def test_a_torn_file_reads_as_empty(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text('{"holders": [')
    assert SimGpuState(path).holders() == []
