"""A supervisor that crashed is replaced by one that adopts the servers and trainer it left.

Real processes throughout: the supervisor, the simulated engines and the simulated trainer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from common.ports import port_free
from supervisor.gpu.sim_state import SimGpuState, pid_alive
from supervisor.procfs import boot_id, process_start_time
from supervisor.records import ProcessStamp, ServerRecord, StateDir, TrainerRecord

pytestmark = pytest.mark.integration

WEIGHTS, CONTEXT, TRAINER = 3000, 100, 20000


def host_config(tmp: Path, tools) -> dict:
    models = [
        {
            "name": name,
            "port": tools.free_port(),
            "profile": {
                "engine": "sim",
                "extraArgs": ["--weights-mib", str(WEIGHTS), "--context-mib", str(CONTEXT)],
            },
        }
        for name in ("qwen-small", "llama-small")
    ]
    return {
        "host": "east",
        "gpu": {"backend": "sim", "simStateFile": str(tmp / "gpu.json")},
        "slots": [
            {"kind": "inference", "gpuIndex": 0, "models": models},
            {
                "kind": "training",
                "gpuIndex": 0,
                "command": [
                    sys.executable,
                    "-m",
                    "supervisor.sim.trainer",
                    "--memory-mib",
                    str(TRAINER),
                    "--step-s",
                    "0.02",
                    "--checkpoint-every-s",
                    "0.1",
                    # Only SIGKILL stops it: the adopted trainer must go through the whole path.
                    "--ignore-sigterm",
                ],
                "checkpointDir": str(tmp / "ckpt"),
                "graceMs": 300,
            },
        ],
    }


def state_dir(tmp: Path, port: int) -> Path:
    # The documented default with the simulated backend: next to the simulated GPU state file.
    return tmp / f"supervisor-{port}"


def models_of(status: dict) -> dict[str, dict]:
    return {m["name"]: m for s in status["slots"] for m in s.get("models", ())}


def trainer_of(status: dict) -> dict:
    return next(s["training"] for s in status["slots"] if s["kind"] == "training")


def used_mib(client: httpx.Client) -> int:
    return client.get("/v1/gpu/memory").json()["gpus"][0]["usedMiB"]


def sigkill_supervisor_only(sup) -> None:
    # Its own pid, not its group: the children must survive, as after a real crash.
    os.kill(sup.proc.pid, signal.SIGKILL)
    sup.proc.wait(timeout=10)


def test_a_restarted_supervisor_adopts_what_the_crashed_one_left_running(
    processes, tools, tmp_path
):
    config = host_config(tmp_path, tools)
    first = tools.start_supervisor(processes, config)
    with first.client() as client:
        assert client.post("/v1/vllm/sleep").status_code == 200
        assert client.post("/v1/training/start").status_code == 200
        tools.wait_for(lambda: used_mib(client) == 2 * CONTEXT + TRAINER)
        before = client.get("/v1/status").json()
    trainer_pid = trainer_of(before)["pids"][0]
    processes.adopt(trainer_pid)
    engine_pids = {n: m["process"]["pid"] for n, m in models_of(before).items()}

    sigkill_supervisor_only(first)
    assert all(pid_alive(pid) for pid in [trainer_pid, *engine_pids.values()])
    # No child may hold on to the supervisor's listening socket (see `bind_socket`).
    assert port_free(first.port)

    second = tools.start_supervisor(processes, config, port=first.port)
    with second.client() as client:
        after = client.get("/v1/status").json()
        assert after["stateKnown"] is True
        for name, model in models_of(after).items():
            old = models_of(before)[name]
            assert model["process"]["state"] == "running"
            assert model["process"]["pid"] == engine_pids[name]
            assert model["process"]["adopted"] is True
            assert model["fingerprint"] == old["fingerprint"]
            assert model["fingerprint"].startswith("sha256:")
            # Read from the server, not assumed: they were put to sleep before the crash.
            assert model["sleeping"] is True
            assert model["process"]["startedAt"] == old["process"]["startedAt"]
        trainer = trainer_of(after)
        assert trainer["state"] == "running" and trainer["pids"] == [trainer_pid]
        assert trainer["adopted"] is True
        assert trainer["lastCheckpointAt"] is not None
        assert trainer["lastCheckpointAt"].endswith("Z")

        assert client.post("/v1/vllm/wake").status_code == 200
        assert all(
            m["sleeping"] is False for m in models_of(client.get("/v1/status").json()).values()
        )
        assert used_mib(client) == 2 * (WEIGHTS + CONTEXT) + TRAINER
        assert client.post("/v1/vllm/sleep").status_code == 200

        assert client.post("/v1/training/stop").status_code == 202
        tools.wait_for(
            lambda: client.get("/v1/training/status").json()["slots"][0]["state"] == "idle",
            timeout=10,
        )
        stopped = client.get("/v1/training/status").json()["slots"][0]
        assert stopped["killed"] is True  # it ignored SIGTERM: the SIGKILL path ran
        assert stopped["lastCheckpointAt"] is not None
        assert not pid_alive(trainer_pid)
        assert used_mib(client) == 2 * CONTEXT
        records = sorted(p.name for p in state_dir(tmp_path, first.port).glob("*.json"))
        assert [r for r in records if r.startswith("trainer")] == []
        assert len([r for r in records if r.startswith("server")]) == 2

    # A graceful stop of the new supervisor stops the adopted servers like its own.
    os.kill(second.proc.pid, signal.SIGTERM)
    assert second.proc.wait(timeout=20) == 0
    assert not any(pid_alive(pid) for pid in engine_pids.values())
    assert SimGpuState(tmp_path / "gpu.json").holders() == []
    assert list(state_dir(tmp_path, first.port).glob("*.json")) == []


def test_dead_reused_and_unrecorded_pids_are_never_adopted(processes, tools, tmp_path):
    config = host_config(tmp_path, tools)
    qwen = config["slots"][0]["models"][0]
    port = tools.free_port()
    records = StateDir(state_dir(tmp_path, port))

    # A server that has exited since its record was written.
    gone = subprocess.Popen(["sleep", "30"], start_new_session=True)
    gone_stamp = ProcessStamp.of(gone.pid)
    gone.kill()
    gone.wait()
    records.save(ServerRecord(qwen["name"], qwen["port"], "sha256:old", 0.0, gone_stamp))

    # An unrelated process that now has the pid a recorded trainer once had.
    stranger = processes.start(["sleep", "30"], env=tools.child_env())
    real_start = process_start_time(stranger.pid)
    assert real_start is not None
    earlier = ProcessStamp(stranger.pid, stranger.pid, str(int(real_start) - 1), boot_id())
    records.save(TrainerRecord(0, ("train",), 0.0, earlier))

    # And a port held by a process with no record at all: not ours, so still a conflict.
    llama_port = config["slots"][0]["models"][1]["port"]
    with socket.create_server(("127.0.0.1", llama_port)):
        sup = tools.start_supervisor(processes, config, port=port, wait_ready=False)
        with sup.client() as client:

            def settled() -> dict | None:
                status = client.get("/v1/status").json()
                models = models_of(status)
                qwen_up = models[qwen["name"]]["sleeping"] is False
                conflict = models["llama-small"]["process"]["state"] == "conflict"
                return status if qwen_up and conflict else None

            status = tools.wait_for(settled)
    processes.adopt(models_of(status)[qwen["name"]]["process"]["pid"])
    assert "fingerprint" not in models_of(status)["llama-small"]
    model = models_of(status)[qwen["name"]]
    assert model["process"]["adopted"] is False
    assert model["process"]["pid"] != gone_stamp.pid
    assert model["fingerprint"] != "sha256:old"
    assert trainer_of(status)["state"] == "idle"
    assert stranger.poll() is None, "a process that merely reuses a pid must not be signalled"
    saved = json.loads((records.path / f"server-{qwen['port']}.json").read_text())
    assert saved["pid"] == model["process"]["pid"]
    assert not (records.path / "trainer-gpu0.json").exists()
