"""The GPU truth's plan and process helpers: what to start, with which environment, and how to
wait for it and stop it. See `bench/gpu_truth.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
START_TIMEOUT_S = 180.0


@dataclass
class Plan:
    """Every size and timing of one run; `--device cpu` shrinks them to seconds."""

    device: str
    gpu_index: int
    sizes_mib: list[int]
    kv_cache_mib: int
    level2_mib: int
    bandwidth_mib: int
    trainer_memory_mib: int
    grace_ms: int
    out: Path
    python: str
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpu-truth-")))

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def state_file(self) -> Path:
        return self.workdir / "sim-gpu.json"


def child_env(plan: Plan, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARU_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    # CUDA numbers GPUs as NVML does only with this; the supervisor sets it for its children.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = str(plan.gpu_index)
    if not plan.cuda:
        env["HARU_SIM_GPU_STATE"] = str(plan.state_file)
    env.update(extra or {})
    return env


def ok_200(response: httpx.Response) -> bool:
    return response.status_code == 200


def wait_http(url: str, ok: Callable[[httpx.Response], bool], timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode} before {url}")
        try:
            if ok(httpx.get(url, timeout=5, trust_env=False)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def engine_args(plan: Plan, weights_mib: int, *extra: str) -> list[str]:
    return [
        "--backend",
        "torch",
        "--device",
        plan.device,
        "--weights-mib",
        str(weights_mib),
        "--kv-cache-mib",
        str(plan.kv_cache_mib),
        "--chunk-mib",
        "256" if plan.cuda else "8",
        *extra,
    ]


def trainer_command(plan: Plan, *extra: str) -> list[str]:
    return [
        plan.python,
        "-m",
        "supervisor.sim.trainer",
        "--backend",
        "torch",
        "--device",
        plan.device,
        "--memory-mib",
        str(plan.trainer_memory_mib),
        "--checkpoint-every-s",
        "1",
        "--min-step-s",
        "0.01" if plan.cuda else "0.05",
        *extra,
    ]


def until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not reached within {timeout:.0f}s")
