"""The GPU truth: what a real card says about Haru's GPU paths, in one run of under 4 minutes.

    PYTHONPATH=. python3 bench/gpu_truth.py [--sizes-gib 8,32] [--gpu-index 0] [--out DIR]
    PYTHONPATH=. var/venvs/torch/bin/python bench/gpu_truth.py --device cpu   # CPU dry run

Runs from a checkout (no install) under a python that has torch, transformers, peft, safetensors,
starlette, uvicorn, httpx and nvidia-ml-py; `bench/gpu_truth.sh` sets that up on a bare GPU host.
Memory is read through the supervisor's own NVML reader, device-level (used memory of the whole
GPU), because per-process readings may be missing in a sandbox.

1. bandwidth: pinned host-to-device copy speed, the physical limit of a level-1 wake (also
   pageable host-to-device and pinned device-to-host, for context);
2. agreement: at each stage below, the change in NVML's used memory against the change in what
   torch reserved (`torch.cuda.memory_reserved()` of the process that changed);
3. sleep and wake of the torch engine at each size: wake time, achieved bandwidth as a fraction
   of step 1's, residue left on the GPU while asleep, checksum before and after; then one level-2
   round trip (reload from a safetensors file) at `--level2-mib`;
4. the torch trainer stopped through the supervisor's own `TrainingSlot` on the SIGTERM path and
   on the SIGKILL path (it ignores SIGTERM): time until NVML shows its memory released;
5. one promotion through a real supervisor's HTTP API (`python -m supervisor`, the torch engine
   as a managed model server asleep on standby, the torch trainer in the training slot): stop
   training, verify the GPU, wake, probe, each step timed;
6. writes every figure to `<out>/gpu-truth-<date>-<gpu>.json`, the table to `.txt` beside it,
   and prints the table with the targets.

With `--device cpu` (or on a host without CUDA) every step runs on the CPU with small sizes:
the supervisor reads the simulated GPUs' state file instead of NVML, and no target is judged.
The torch tier runs this mode, so the script cannot rot between GPU loans.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu_truth_procs import (  # noqa: E402
    START_TIMEOUT_S,
    Plan,
    child_env,
    engine_args,
    ok_200,
    stop_process,
    trainer_command,
    until,
    wait_http,
)
from bench.gpu_truth_report import judge, render_table  # noqa: E402
from common.ports import free_port  # noqa: E402
from fleets.core.policy import DEFAULTS  # noqa: E402
from supervisor.clock import SystemClock  # noqa: E402
from supervisor.config import TrainingSlotConfig  # noqa: E402
from supervisor.gpu.nvml import NvmlBackend  # noqa: E402
from supervisor.gpu.sim_state import ENV_VAR as SIM_STATE_ENV  # noqa: E402
from supervisor.gpu.sim_state import SimGpuState  # noqa: E402
from supervisor.processes import AsyncioSpawner  # noqa: E402
from supervisor.training import TrainingSlot  # noqa: E402

MIB = 1024 * 1024
GIB = 1024 * MIB
# NVML rounds to MiB and the driver allocates in pages: "released" means back within this.
RELEASE_SLACK_BYTES = 64 * MIB


def parse_args(argv: list[str] | None = None) -> Plan:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--dry-run", action="store_true", help="the same as --device cpu")
    p.add_argument("--gpu-index", type=int, default=0, help="NVML index of the GPU to use")
    p.add_argument("--sizes-gib", default=None, help="engine weight sizes (GPU default 8,32)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="GPU default 2")
    p.add_argument("--level2-gib", type=float, default=None, help="GPU default 2")
    p.add_argument("--bandwidth-gib", type=float, default=None, help="GPU default 4")
    p.add_argument("--trainer-memory-gib", type=float, default=None, help="GPU default 8")
    p.add_argument("--grace-ms", type=int, default=None, help="trainer stop grace (GPU 5000)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    a = p.parse_args(argv)
    import torch  # noqa: PLC0415 - heavy, and only this script needs it

    device = "cpu" if a.dry_run else a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    gpu = device == "cuda"

    def mib(value: float | None, gpu_default: float, cpu_default_mib: int) -> int:
        if value is not None:
            return int(value * 1024)
        return int(gpu_default * 1024) if gpu else cpu_default_mib

    sizes = (
        [int(float(s) * 1024) for s in a.sizes_gib.split(",") if s.strip()]
        if a.sizes_gib
        else ([8 * 1024, 32 * 1024] if gpu else [16, 48])
    )
    if not sizes or min(sizes) < 1:
        p.error("--sizes-gib needs at least one positive size")
    return Plan(
        device=device,
        gpu_index=a.gpu_index,
        sizes_mib=sizes,
        kv_cache_mib=mib(a.kv_cache_gib, 2, 8),
        level2_mib=mib(a.level2_gib, 2, 16),
        bandwidth_mib=mib(a.bandwidth_gib, 4, 32),
        trainer_memory_mib=mib(a.trainer_memory_gib, 8, 16),
        grace_ms=a.grace_ms if a.grace_ms is not None else (5000 if gpu else 3000),
        out=Path(a.out),
        python=sys.executable,
    )


# -- memory readings -----------------------------------------------------------------------------


class MemoryReader:
    """Used memory of one GPU as the supervisor reports it: NVML, or simulated GPUs on a CPU."""

    def __init__(self, plan: Plan, nvml: NvmlBackend | None = None) -> None:
        self.plan = plan
        self.source = "nvml" if plan.cuda else "sim-state"
        self._nvml = (nvml or NvmlBackend()) if plan.cuda else None
        self._sim = None if plan.cuda else SimGpuState(plan.state_file)

    def used_bytes(self) -> int:
        if self._nvml is not None:
            facts = {g.index: g for g in self._nvml.read_sync()}
            return facts[self.plan.gpu_index].used_mib * MIB
        assert self._sim is not None
        return self._sim.used_mib(self.plan.gpu_index) * MIB

    def gpu(self) -> dict[str, Any]:
        if self._nvml is None:
            return {"name": "cpu (dry run)", "source": self.source}
        g = {g.index: g for g in self._nvml.read_sync()}[self.plan.gpu_index]
        return {
            "name": g.name,
            "uuid": g.uuid,
            "totalMiB": g.total_mib,
            "computeCapability": g.compute_capability,
            "source": self.source,
        }

    def wait_until(self, predicate: Callable[[int], bool], timeout: float) -> float | None:
        """Poll every 10 ms; return the monotonic time the reading first satisfied it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.used_bytes()):
                return time.monotonic()
            time.sleep(0.01)
        return None

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def stage(
    name: str, reader: MemoryReader, before: dict[str, int], torch_bytes: int | None, **extra: Any
) -> dict[str, Any]:
    """One row of step 2: the change NVML saw against the change torch reported."""
    used = reader.used_bytes()
    row: dict[str, Any] = {
        "stage": name,
        "usedBytes": used,
        "nvmlDeltaBytes": used - before["used"],
        "torchBytes": torch_bytes,
        "torchDeltaBytes": None if torch_bytes is None else torch_bytes - before["torch"],
        **extra,
    }
    before["used"], before["torch"] = used, torch_bytes if torch_bytes is not None else 0
    return row


# -- step 1: bandwidth ---------------------------------------------------------------------------


def measure_bandwidth(plan: Plan) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - heavy and optional: only the torch measurements need it

    device = torch.device("cuda", plan.gpu_index) if plan.cuda else torch.device("cpu")
    n = plan.bandwidth_mib * MIB

    def best_of(src: Any, dst: Any, repeats: int = 5) -> float:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            if plan.cuda:
                torch.cuda.synchronize()
            began = time.perf_counter()
            dst.copy_(src, non_blocking=plan.cuda)
            if plan.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - began)
        return n / min(times[1:])

    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=plan.cuda).fill_(1)
    pageable = torch.empty(n, dtype=torch.uint8).fill_(2)
    on_device = torch.empty(n, dtype=torch.uint8, device=device)
    out = {
        "bytes": n,
        "pinnedH2DBytesPerS": best_of(pinned, on_device),
        "pageableH2DBytesPerS": best_of(pageable, on_device),
        "pinnedD2HBytesPerS": best_of(on_device, pinned),
    }
    del pinned, pageable, on_device
    if plan.cuda:
        torch.cuda.empty_cache()
    return out


# -- step 3: sleep and wake ----------------------------------------------------------------------


def engine_round_trip(
    plan: Plan, reader: MemoryReader, weights_mib: int, level: int, bandwidth: float
) -> dict[str, Any]:
    port = free_port()
    weights_file = plan.workdir / f"w{weights_mib}.safetensors"
    extra = ["--weights-file", str(weights_file)] if level == 2 else []
    argv = [plan.python, "-m", "supervisor.sim", "--port", str(port), "--model", "truth"]
    argv += engine_args(plan, weights_mib, *extra)
    before = {"used": reader.used_bytes(), "torch": 0}
    baseline = before["used"]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(argv, env=child_env(plan), start_new_session=True)
    stages: list[dict[str, Any]] = []
    try:
        began = time.monotonic()
        wait_http(f"{url}/health", ok_200, START_TIMEOUT_S, proc)
        with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:

            def facts(checksum: bool = False) -> dict[str, Any]:
                return c.get("/_sim/backend", params={"checksum": "1"} if checksum else None).json()

            def held(f: dict[str, Any]) -> int:
                # What torch says this process holds: reserved on a GPU, its tensors on a CPU.
                reserved = f["torchReservedBytes"]
                return (
                    reserved
                    if reserved is not None
                    else f["weightsOnDeviceBytes"] + f["kvCacheBytes"]
                )

            loaded = facts(checksum=True)
            start_s = time.monotonic() - began
            # The load also brings the process's CUDA context, which torch does not count.
            stages.append(stage("engine load", reader, before, held(loaded), judged=False))
            t = time.monotonic()
            c.post("/sleep", params={"level": str(level)}).raise_for_status()
            sleep_s = time.monotonic() - t
            asleep = facts()
            stages.append(stage(f"level-{level} sleep", reader, before, held(asleep), judged=True))
            residue = before["used"] - baseline
            t = time.monotonic()
            c.post("/wake_up").raise_for_status()
            wake_s = time.monotonic() - t
            awake = facts(checksum=True)
            stages.append(stage("wake", reader, before, held(awake), judged=True))
            weights_wake = awake["lastWeightsWake"] or {}
            achieved = weights_wake.get("bytesPerS")
            result = {
                "weightsMiB": weights_mib,
                "level": level,
                "startS": start_s,
                "loadS": (loaded["lastLoad"] or {}).get("seconds"),
                "sleepHttpS": sleep_s,
                "sleepS": (asleep["lastSleep"] or {}).get("seconds"),
                "wakeHttpS": wake_s,
                "wakeWeightsS": weights_wake.get("seconds"),
                "wakeBytesPerS": achieved,
                "wakeFractionOfPinned": achieved / bandwidth if achieved and bandwidth else None,
                "residueWhileAsleepBytes": residue,
                "torchReservedWhileAsleepBytes": asleep["torchReservedBytes"],
                "checksumBefore": loaded["checksum"],
                "checksumAfter": awake["checksum"],
                "bitExact": loaded["checksum"] == awake["checksum"],
                "stages": stages,
            }
    finally:
        stopped_at = time.monotonic()
        stop_process(proc)
    released = reader.wait_until(lambda used: used <= baseline + RELEASE_SLACK_BYTES, 30)
    result["engineExitReleaseS"] = None if released is None else released - stopped_at
    return result


# -- step 4: trainer stop paths ------------------------------------------------------------------


async def trainer_stop(plan: Plan, reader: MemoryReader, path: str) -> dict[str, Any]:
    """Run the torch trainer under the supervisor's TrainingSlot; stop it on one path."""
    ckpt = plan.workdir / f"ckpt-{path}"
    report = plan.workdir / f"trainer-{path}.json"
    extra = ["--report", str(report)] + (["--ignore-sigterm"] if path == "sigkill" else [])
    config = TrainingSlotConfig(
        gpu_index=plan.gpu_index,
        command=tuple(trainer_command(plan, *extra)),
        checkpoint_dir=ckpt,
        grace_ms=plan.grace_ms,
    )
    environ = child_env(plan)
    environ.pop("CUDA_VISIBLE_DEVICES")  # the slot sets it, as the supervisor does
    # The slot passes its trainer only the allowed part of `environ` (supervisor/child_env.py);
    # the simulated GPU's state file goes as the supervisor's host does give it (host_env).
    sim = {k: environ[k] for k in (SIM_STATE_ENV,) if k in environ}
    slot = TrainingSlot(
        config, spawner=AsyncioSpawner(), clock=SystemClock(), environ=environ, host_env=sim
    )
    baseline = reader.used_bytes()
    began = time.monotonic()
    await slot.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    facts: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            facts = json.loads(report.read_text())
        except (OSError, ValueError):
            facts = {}
        if facts.get("phase") == "training" and (ckpt.exists() and any(ckpt.iterdir())):
            break
        if slot.state == "idle":
            raise RuntimeError(f"trainer exited early ({slot.last_exit_code}): {slot.last_error}")
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError("trainer did not reach its first checkpoint")
    ready_s = time.monotonic() - began
    held = reader.used_bytes() - baseline
    stopped = time.monotonic()
    slot.stop()
    await slot.wait_idle(plan.grace_ms / 1000 + 30)
    exited = time.monotonic()
    released = await asyncio.to_thread(
        reader.wait_until, lambda used: used <= baseline + RELEASE_SLACK_BYTES, 30
    )
    return {
        "path": path,
        "graceMs": plan.grace_ms,
        "readyS": ready_s,
        "heldBytes": held,
        "torchReservedBytes": facts.get("torchReservedBytes"),
        "plannedBytes": facts.get("plannedBytes"),
        "exitCode": slot.last_exit_code,
        "killed": slot.killed,
        "exitS": exited - stopped,
        "releasedS": None if released is None else released - stopped,
        "releasedAfterExitS": None if released is None else released - exited,
    }


# -- step 5: one promotion through the supervisor ------------------------------------------------


def promotion(plan: Plan, reader: MemoryReader) -> dict[str, Any]:
    port, model_port, token = free_port(), free_port(), secrets.token_hex(16)
    weights_mib = min(plan.sizes_mib)
    gpu: dict[str, Any] = (
        {"backend": "nvml"}
        if plan.cuda
        else {
            "backend": "sim",
            "simStateFile": str(plan.state_file),
            "simGpus": [{"index": plan.gpu_index, "totalMiB": 4096, "name": "SIM-CPU"}],
        }
    )
    config = {
        "host": "gpu-truth",
        "gpu": gpu,
        "stateDir": str(plan.workdir / "supervisor-state"),
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": plan.gpu_index,
                "models": [
                    {
                        "name": "truth",
                        "port": model_port,
                        "profile": {
                            "engine": "sim",
                            "executable": plan.python,
                            "extraArgs": engine_args(plan, weights_mib, "--start-asleep"),
                        },
                    }
                ],
            },
            {
                "kind": "training",
                "gpuIndex": plan.gpu_index,
                "command": trainer_command(plan),
                "checkpointDir": str(plan.workdir / "ckpt-promotion"),
                "graceMs": plan.grace_ms,
            },
        ],
    }
    env = child_env(
        plan,
        {
            "PORT": str(port),
            "HARU_SUPERVISOR_CONFIG": json.dumps(config),
            "HARU_SUPERVISOR_TOKEN": token,
            "HARU_SUPERVISOR_LOG_LEVEL": "warning",
        },
    )
    env.pop("CUDA_VISIBLE_DEVICES")  # the supervisor pins each child itself
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [plan.python, "-m", "supervisor"], env=env, start_new_session=True, cwd=plan.workdir
    )
    steps: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {token}"}
    try:
        wait_http(f"{url}/healthz", ok_200, 60, proc)
        with httpx.Client(base_url=url, headers=headers, timeout=600, trust_env=False) as c:
            # Standby posture: the engine loaded and asleep, the trainer holding the GPU.
            until(lambda: c.get("/v1/ready").status_code == 200, START_TIMEOUT_S, "ready")
            # Healthy once its weights are loaded and (--start-asleep) moved to host memory.
            wait_http(f"http://127.0.0.1:{model_port}/health", ok_200, START_TIMEOUT_S)
            c.post("/v1/training/start").raise_for_status()
            ckpt = plan.workdir / "ckpt-promotion"
            until(lambda: ckpt.exists() and any(ckpt.iterdir()), START_TIMEOUT_S, "training")
            standby_used = reader.used_bytes()
            began = time.monotonic()
            t = time.monotonic()
            c.post("/v1/training/stop", json={"graceMs": plan.grace_ms}).raise_for_status()

            def idle() -> bool:
                slots = c.get("/v1/training/status").json()["slots"]
                return all(s["state"] == "idle" for s in slots)

            until(idle, plan.grace_ms / 1000 + 30, "training stop")
            steps["stop_training"] = time.monotonic() - t
            t = time.monotonic()
            limit = DEFAULTS["verifyGpuMaxUsedRatio"]
            memory: dict[str, Any] = {}

            def verified() -> bool:
                nonlocal memory
                memory = c.get("/v1/gpu/memory").json()
                g = next(g for g in memory["gpus"] if g["index"] == plan.gpu_index)
                return g["usedMiB"] / g["totalMiB"] <= limit

            until(verified, 30, "GPU memory released")
            steps["verify_gpu"] = time.monotonic() - t
            t = time.monotonic()
            woke = c.post("/v1/vllm/wake", json={"gpuIndex": plan.gpu_index})
            woke.raise_for_status()
            steps["wake"] = time.monotonic() - t
            t = time.monotonic()
            probe = c.post("/v1/probe", json={"prompt": "ping", "maxTokens": 4}).json()
            steps["probe"] = time.monotonic() - t
            total = time.monotonic() - began
            status = c.get("/v1/status").json()
    finally:
        stop_process(proc, timeout=60)
    return {
        "weightsMiB": weights_mib,
        "stepsS": steps,
        "totalS": total,
        "probeOk": probe.get("ok"),
        "ready": status.get("ready"),
        "standbyUsedBytes": standby_used,
        "gpuAfterVerify": memory.get("gpus"),
        "verifyMaxUsedRatio": limit,
    }


# -- the run -------------------------------------------------------------------------------------


def run(plan: Plan) -> dict[str, Any]:
    reader = MemoryReader(plan)
    results: dict[str, Any] = {
        "startedAt": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": plan.device,
        "gpu": reader.gpu(),
        "plan": {
            "sizesMiB": plan.sizes_mib,
            "kvCacheMiB": plan.kv_cache_mib,
            "level2MiB": plan.level2_mib,
            "bandwidthMiB": plan.bandwidth_mib,
            "trainerMemoryMiB": plan.trainer_memory_mib,
            "graceMs": plan.grace_ms,
        },
    }
    began = time.monotonic()
    results["errors"] = errors = []

    def attempt(what: str, step: Callable[[], Any]) -> Any:
        # A GPU is lent for minutes: one failing step must not lose the figures of the others.
        print(f"{time.monotonic() - began:6.1f}s {what}", flush=True)
        try:
            return step()
        except Exception as exc:
            errors.append({"step": what, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc()
            return None

    try:
        import torch  # noqa: PLC0415 - heavy and optional: only the torch measurements need it

        results["torch"] = torch.__version__
        print(f"gpu truth on {results['gpu']['name']} ({plan.device})", flush=True)
        results["bandwidth"] = attempt("1/5 bandwidth", lambda: measure_bandwidth(plan))
        pinned = (results["bandwidth"] or {}).get("pinnedH2DBytesPerS", 0.0)
        results["engines"], results["trainer"] = [], []
        for size, level in [(size, 1) for size in plan.sizes_mib] + [(plan.level2_mib, 2)]:
            engine = attempt(
                f"2-3/5 engine level-{level} sleep and wake at {size} MiB",
                lambda s=size, lv=level: engine_round_trip(plan, reader, s, lv, pinned),
            )
            if engine is not None:
                results["engines"].append(engine)
        for path in ("sigterm", "sigkill"):
            trainer = attempt(
                f"4/5 trainer stop on the {path} path",
                lambda p=path: asyncio.run(trainer_stop(plan, reader, p)),
            )
            if trainer is not None:
                results["trainer"].append(trainer)
        results["promotion"] = attempt(
            "5/5 promotion through the supervisor", lambda: promotion(plan, reader)
        )
    finally:
        reader.close()
        results["durationS"] = time.monotonic() - began
    results["targets"] = judge(results)
    return results


def write_results(plan: Plan, results: dict[str, Any], table: str) -> Path:
    plan.out.mkdir(parents=True, exist_ok=True)
    day = results["startedAt"][:10]
    gpu = re.sub(r"[^a-z0-9]+", "-", str(results["gpu"]["name"]).lower()).strip("-")
    base = plan.out / f"gpu-truth-{day}-{gpu}"
    base.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    base.with_suffix(".txt").write_text(table + "\n")
    return base.with_suffix(".json")


def main(argv: list[str] | None = None) -> int:
    # Before torch initialises CUDA: number GPUs as NVML does, so --gpu-index means one card to
    # both (the children get it from child_env, as the supervisor's children do).
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    plan = parse_args(argv)
    results = run(plan)
    table = render_table(results)
    path = write_results(plan, results, table)
    # Level-2 weight files and checkpoints: gigabytes on a GPU host's small disk.
    shutil.rmtree(plan.workdir, ignore_errors=True)
    print(table)
    print(f"\nwritten: {path} (and .txt)")
    failed = [t for t in results["targets"] if t["pass"] is False]
    for e in results["errors"]:
        print(f"ERROR in {e['step']}: {e['error']}")
    return 1 if failed or results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
