"""`python -m supervisor.sim.trainer --backend torch`: real training under the trainer contract.

It trains a LoRA adapter (peft) on a small, randomly initialised Llama built from a local config
(no downloads), on synthetic token sequences, so it needs nothing but torch, transformers and
peft. With `--base-model-dir` it trains on a real Hugging Face model instead, on a small fixed
chat corpus, and with `--adapter-name` publishes servable adapters (`torch_adapters.py`:
peft's files plus the manifest of docs/adapters.md, eval answers as vLLM gives them). It
honours what the supervisor promises and asks of a trainer:
- runs on `HARU_GPU_INDEX` (device 0 when `CUDA_VISIBLE_DEVICES` pins it), or on the CPU;
- stays within `HARU_GPU_MEMORY_LIMIT_MIB` when given: on a GPU through torch's per-process
  memory fraction (the allocator refuses beyond it), and on both by refusing to start when its
  planned allocation (model, adapter's gradients and optimizer state, `--memory-mib` ballast)
  does not fit (exit 3); the CPU has no allocator cap, so that check is the whole limit there;
- checkpoints to `HARU_CHECKPOINT_DIR` (`step-NNNNNN/`: adapter, optimizer, state), written
  under a dot-name and renamed into place, and resumes from the newest complete one;
- on SIGTERM finishes the step, saves and exits 0; `--ignore-sigterm` tests the SIGKILL path.

torch, transformers and peft are heavy optional dependencies: `supervisor.sim.trainer` imports
this module only for `--backend torch`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch  # heavy optional dependency, see the module docstring
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from supervisor.gpu.sim_state import SimGpuState
from supervisor.sim.backends import cuda_ordinal, stop_on_sigterm, torch_adapters

MIB = 1024 * 1024
KEEP_CHECKPOINTS = 3
EXIT_CONFIG = 2
EXIT_MEMORY_LIMIT = 3
LIMIT_ENV = "HARU_GPU_MEMORY_LIMIT_MIB"
_CHECKPOINT = re.compile(r"^step-(\d+)$")


def log(message: str) -> None:
    print(f"[torch-trainer pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


class MemoryLimitExceeded(Exception):
    """What the trainer needs does not fit in HARU_GPU_MEMORY_LIMIT_MIB."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m supervisor.sim.trainer --backend torch")
    p.add_argument("--backend", choices=("torch",), default="torch")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lr", type=float, default=None, help="5e-3; 2e-2 with --base-model-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every-s", type=float, default=2.0)
    p.add_argument("--max-steps", type=int, default=0, help="exit 0 after this many (0 = never)")
    p.add_argument("--min-step-s", type=float, default=0.0, help="pace the loop (shared CPUs)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads torch may use")
    p.add_argument(
        "--memory-mib", type=int, default=0, help="extra device memory to hold, like activations"
    )
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--report", default=None, help="keep a JSON of step and memory facts here")
    g = p.add_argument_group("adapters", "a real base model, and servable adapters")
    g.add_argument("--base-model-dir", default=None, help="a Hugging Face model directory")
    g.add_argument("--adapter-name", default=None, help="publish adapters under this name")
    g.add_argument("--served-model", default=None, help="the base model's served name")
    g.add_argument("--eval-prompt", action="append", default=None, help="repeatable")
    g.add_argument("--eval-max-tokens", type=int, default=16)
    g.add_argument(
        "--publish-every-steps", type=int, default=0, help="0: only when --max-steps ends it"
    )
    a = p.parse_args(argv)
    torch_adapters.check_arguments(p, a)
    for name in ("hidden", "layers", "heads", "vocab", "seq_len", "batch", "lora_r"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.hidden % a.heads:
        p.error("--hidden must be a multiple of --heads")
    if a.memory_mib < 0:
        p.error("--memory-mib must not be negative")
    return a


def memory_limit_mib(environ: dict[str, str]) -> int | None:
    raw = (environ.get(LIMIT_ENV) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{LIMIT_ENV} must be a whole number of MiB >= 1, got {raw!r}")
    return int(raw)


def pick_device(choice: str, environ: dict[str, str]) -> tuple[torch.device, int]:
    raw = (environ.get("HARU_GPU_INDEX") or "0").strip()
    if not raw.isdigit():
        raise ValueError(f"HARU_GPU_INDEX must be a GPU index, got {raw!r}")
    gpu_index = int(raw)
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu"), gpu_index
    if not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device("cuda", cuda_ordinal(gpu_index, environ)), gpu_index


def build_model(a: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """A small Llama with random weights, from a local config; the same for the same seed.
    With --base-model-dir, that model (float32) instead, with the same LoRA."""
    torch.manual_seed(a.seed)
    if a.base_model_dir:
        return torch_adapters.lora_model(a.base_model_dir, a.lora_r).to(device)
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.hidden * 2,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=max(1, a.heads // 2),
        max_position_embeddings=max(128, a.seq_len),
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(
        r=a.lora_r, lora_alpha=2 * a.lora_r, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
    )
    return get_peft_model(base, lora).to(device)


def planned_bytes(model: torch.nn.Module, ballast_mib: int) -> int:
    """What training will hold: every parameter, and for the trainable ones a gradient and
    AdamW's two moments; plus the ballast."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return total + 3 * trainable + ballast_mib * MIB


def adapter_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def batch_for(step: int, a: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """A deterministic batch per step: arithmetic sequences, which a model can learn."""
    g = torch.Generator().manual_seed(a.seed * 1_000_003 + step)
    starts = torch.randint(0, a.vocab, (a.batch, 1), generator=g)
    strides = torch.randint(1, 4, (a.batch, 1), generator=g)
    return ((starts + strides * torch.arange(a.seq_len)) % a.vocab).to(device)


# -- checkpoints ---------------------------------------------------------------------------------


def checkpoints_newest_first(directory: Path) -> list[Path]:
    """Every `step-N` checkpoint directory, newest first."""
    found: list[tuple[int, Path]] = []
    for entry in directory.iterdir() if directory.is_dir() else []:
        match = _CHECKPOINT.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return [path for _, path in sorted(found, reverse=True)]


def resume(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> int:
    """Load the newest checkpoint that loads whole; return its step (0 when there is none).

    A checkpoint torn by a crash mid-save, or whose adapter no longer matches its digest, is
    skipped for the one before: losing a few steps beats a trainer that cannot start.
    """
    for path in checkpoints_newest_first(directory):
        try:
            state = load_checkpoint(path, model, optimizer, device)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log(f"skipping checkpoint {path.name}: {exc}")
            continue
        step = int(state["step"])
        log(f"resumed from step {step} ({path}); adapter digest {state['adapterDigest']}")
        return step
    log(f"no checkpoint in {directory}; starting at step 0")
    return 0


def save_checkpoint(
    directory: Path,
    step: int,
    reason: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:06d}"
    tmp = directory / f".step-{step:06d}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    adapter = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(adapter, str(tmp / "adapter_model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    state = {
        "step": step,
        "reason": reason,
        "savedAt": time.time(),
        "adapterDigest": adapter_digest(adapter),
        **extra,
    }
    with open(tmp / "state.json", "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    olds = sorted(p for p in directory.iterdir() if _CHECKPOINT.match(p.name))
    for old in olds[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, Any]:
    state = json.loads((path / "state.json").read_text())
    adapter = load_file(str(path / "adapter_model.safetensors"), device=str(device))
    if adapter_digest(adapter) != state.get("adapterDigest"):
        raise ValueError(f"{path.name}: the adapter does not match its recorded digest")
    set_peft_model_state_dict(model, adapter)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device))
    return state


# -- the loop ------------------------------------------------------------------------------------


class Report:
    """A small JSON the GPU truth script reads: what torch holds, at which step."""

    def __init__(self, path: str | None, device: torch.device) -> None:
        self.path = Path(path) if path else None
        self.device = device
        self.facts: dict[str, Any] = {"pid": os.getpid(), "device": str(device)}

    def write(self, **facts: Any) -> None:
        self.facts.update(facts)
        if self.device.type == "cuda":
            self.facts["torchReservedBytes"] = torch.cuda.memory_reserved(self.device)
            self.facts["torchAllocatedBytes"] = torch.cuda.memory_allocated(self.device)
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.facts))
        os.replace(tmp, self.path)


def main(argv: list[str] | None = None) -> int:
    """Train until stopped, then leave the process at once (this never returns).

    Python's own teardown of torch, transformers and peft took 5 to 8 s after the final save
    on a busy CPU (measured: SIGTERM -> saved in 30 ms -> process gone 7.8 s later), time that
    counts against the supervisor's grace and, on a standby, against the failover. Everything
    worth keeping is saved and flushed by then, so skip it.
    """
    code = train(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def train(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    environ = dict(os.environ)
    raw_dir = environ.get("HARU_CHECKPOINT_DIR")
    if not raw_dir:
        log("HARU_CHECKPOINT_DIR is not set; the supervisor sets it")
        return EXIT_CONFIG
    checkpoint_dir = Path(raw_dir)
    try:
        limit_mib = memory_limit_mib(environ)
        device, gpu_index = pick_device(a.device, environ)
    except ValueError as exc:
        log(str(exc))
        return EXIT_CONFIG
    torch.set_num_threads(max(1, a.threads))

    stop = stop_on_sigterm(ignore=a.ignore_sigterm, log=log)
    report = Report(a.report, device)
    state_file = environ.get("HARU_SIM_GPU_STATE")
    sim_state = None
    try:
        if device.type == "cuda" and limit_mib is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            # The allocator then refuses (OutOfMemoryError) anything beyond the limit.
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mib * MIB / total), device)
        model = build_model(a, device)
        planned = planned_bytes(model, a.memory_mib)
        if limit_mib is not None and planned > limit_mib * MIB:
            raise MemoryLimitExceeded(
                f"needs {planned / MIB:.1f} MiB, over {LIMIT_ENV}={limit_mib}"
            )
        ballast = torch.zeros(a.memory_mib * MIB, dtype=torch.uint8, device=device)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr)
        step = resume(checkpoint_dir, model, optimizer, device)
        pinned = environ.get("CUDA_VISIBLE_DEVICES")
        log(
            f"training on {device} (GPU {gpu_index}, CUDA_VISIBLE_DEVICES={pinned}); "
            f"planned {planned / MIB:.1f} MiB, limit {limit_mib or 'none'}"
        )
        if state_file:
            sim_state = SimGpuState(state_file)
            sim_state.hold(gpu_index, -(-planned // MIB), "trainer")
        report.write(phase="training", step=step, plannedBytes=planned, ballastBytes=ballast.nbytes)
        return _train(a, model, optimizer, step, checkpoint_dir, stop, report, device)
    except (MemoryLimitExceeded, torch.OutOfMemoryError) as exc:
        log(f"memory limit: {exc}")
        return EXIT_MEMORY_LIMIT
    finally:
        if sim_state is not None:
            sim_state.release()


def _train(
    a: argparse.Namespace,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    checkpoint_dir: Path,
    stop: threading.Event,
    report: Report,
    device: torch.device,
) -> int:
    extra = {"seed": a.seed, "device": str(device)}
    model.train()
    last_save = time.monotonic()
    loss_value = None
    publisher = torch_adapters.Publisher.maybe(a, checkpoint_dir, device)
    while not stop.is_set():
        began = time.monotonic()
        if publisher is not None:
            loss = model(**publisher.batch).loss
        else:
            tokens = batch_for(step, a, device)
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_value = float(loss.detach())
        if (
            publisher is not None
            and a.adapter_name
            and (
                (a.publish_every_steps and step % a.publish_every_steps == 0)
                or (a.max_steps and step >= a.max_steps)
            )
        ):
            path = publisher.publish(model, step, loss_value)
            model.train()
            log(f"published adapter {a.adapter_name} at step {step}: {path.name}")
        if a.max_steps and step >= a.max_steps:
            save_checkpoint(checkpoint_dir, step, "finished", model, optimizer, extra)
            report.write(phase="finished", step=step, loss=loss_value)
            log(f"finished at step {step} (loss {loss_value:.4f})")
            return 0
        if time.monotonic() - last_save >= a.checkpoint_every_s:
            save_checkpoint(checkpoint_dir, step, "periodic", model, optimizer, extra)
            report.write(phase="training", step=step, loss=loss_value)
            log(f"checkpoint at step {step} (loss {loss_value:.4f})")
            last_save = time.monotonic()
        stop.wait(max(0.0, a.min_step_s - (time.monotonic() - began)))
    path = save_checkpoint(checkpoint_dir, step, "sigterm", model, optimizer, extra)
    report.write(phase="stopped", step=step, loss=loss_value)
    log(f"SIGTERM: saved step {step} to {path.name}; exiting")
    return 0
