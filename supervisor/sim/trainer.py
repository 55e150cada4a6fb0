"""`python -m supervisor.sim.trainer`: a simulated trainer that honours Haru's trainer contract.

- resumes from the newest `step-NNNNNN.json` in HARU_CHECKPOINT_DIR and says which step;
- writes a checkpoint every few seconds, atomically (write, fsync, rename);
- holds simulated GPU memory on HARU_GPU_INDEX while it runs (and with `--leak-mib`, some that
  stays held after it dies, to test the supervisor's pre-wake memory check);
- with `--adapter-name`, also publishes a servable LoRA adapter every `--publish-every-s`
  (`adapter-NNNNNN/`: adapter_config.json, adapter_model.safetensors, and last the manifest
  haru-adapter.json, docs/adapters.md's trainer contract), its eval answers the ones the
  simulated engine gives for it (supervisor/sim/adapters.py); `--bad` (or `--bad-versions`)
  flags versions that the engine then serves with errors or latency;
- with `--backend torch`, trains a real LoRA adapter instead (`backends/torch_trainer.py`);
- on SIGTERM saves within `--sigterm-save-s` and exits 0, or with `--ignore-sigterm` keeps
  going, so the supervisor's SIGKILL path can be tested.

Standard library only (Python 3.9+): it runs under whatever `python3` the command names.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.adapter_manifest import (
    MAX_EVAL,
    MAX_EVAL_TOKENS,
    MAX_PROMPT_CHARS,
    EvalAnswer,
    manifest_for,
    manifest_write,
    name_valid,
)
from supervisor.gpu.sim_state import SimGpuState
from supervisor.sim import adapters
from supervisor.sim.backends import stop_on_sigterm

_CHECKPOINT = re.compile(r"^step-(\d+)\.json$")
_ADAPTER = re.compile(r"^adapter-(\d+)$")
KEEP_CHECKPOINTS = 3
# Published adapters kept: the supervisor imports each into its store when it lists them, so
# only the newest few need to stay; older ones are pruned, oldest first.
KEEP_ADAPTERS = 5
DEFAULT_EVAL_PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "How do I reset my password?",
)
RANK = 8
TARGET_MODULES = ("q_proj", "v_proj")


def log(message: str) -> None:
    print(f"[sim-trainer pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


def newest_step(directory: Path) -> int:
    """Return the step of the newest readable checkpoint, or 0 when there is none."""
    steps: list[int] = []
    for entry in directory.iterdir() if directory.is_dir() else []:
        match = _CHECKPOINT.match(entry.name)
        if match:
            steps.append(int(match.group(1)))
    for step in sorted(steps, reverse=True):
        try:
            data = json.loads((directory / f"step-{step:06d}.json").read_text())
            return int(data["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a torn file from a crash: fall back to the previous one
    return 0


def write_checkpoint(directory: Path, step: int, reason: str) -> Path:
    """Write `step-NNNNNN.json` atomically and prune all but the newest few."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"step-{step:06d}.json"
    fd, tmp = tempfile.mkstemp(prefix=".step-", dir=str(directory))
    with os.fdopen(fd, "w") as f:
        json.dump({"step": step, "reason": reason, "savedAt": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    olds = sorted(
        (p for p in directory.iterdir() if _CHECKPOINT.match(p.name)), key=lambda p: p.name
    )
    for old in olds[:-KEEP_CHECKPOINTS]:
        with contextlib.suppress(OSError):
            old.unlink()
    return target


@dataclass(frozen=True)
class AdapterPlan:
    """What to publish: the flags of `--adapter-name` and its companions."""

    name: str
    served_model: str
    base_reply: str
    prompts: tuple[str, ...]
    max_tokens: int
    seed: int
    bad: adapters.SimBehaviour | None
    bad_versions: frozenset[int]


def publish_adapter(
    directory: Path, step: int, plan: AdapterPlan, *, version: int, now: float
) -> Path:
    """Write `adapter-NNNNNN/` whole: the files, then the manifest, in a dot-named directory
    renamed into place, so a torn directory never looks complete; prune older ones."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"adapter-{step:06d}"
    tmp = directory / f".adapter-{step:06d}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    bad = plan.bad if (plan.bad is not None and version in plan.bad_versions) else None
    if plan.bad is not None and not plan.bad_versions:
        bad = plan.bad  # --bad without --bad-versions: every version
    config = adapters.peft_config(
        base_model=plan.served_model, rank=RANK, target_modules=TARGET_MODULES, bad=bad
    )
    _write_synced(tmp / adapters.CONFIG_NAME, json.dumps(config, indent=2).encode())
    weights = adapters.fake_weights(
        name=plan.name, step=step, seed=plan.seed, rank=RANK, target_modules=TARGET_MODULES
    )
    _write_synced(tmp / adapters.WEIGHT_NAMES[0], weights)
    # The same functions the simulated engine answers with, so it reproduces these exactly.
    digest = hashlib.sha256(weights).hexdigest()
    base = adapters.scripted_answer(plan.base_reply, plan.max_tokens)
    answers = [
        EvalAnswer(
            prompt=prompt,
            max_tokens=plan.max_tokens,
            answer=adapters.scripted_answer(
                adapters.adapter_reply(digest, prompt), plan.max_tokens
            ),
            base_answer=base,
        )
        for prompt in plan.prompts
    ]
    manifest = manifest_for(
        tmp,
        name=plan.name,
        base_model=plan.served_model,
        base_model_digest=sim_base_digest(plan.served_model),
        rank=RANK,
        target_modules=TARGET_MODULES,
        eval_answers=answers,
        completed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        training={
            "steps": step,
            "loss": round(2.5 / (1 + step / 100), 4),
            "checkpoint": f"step-{step:06d}",
            "simBad": bad is not None,
        },
    )
    manifest_write(tmp, manifest)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(directory)
    olds = sorted(p for p in directory.iterdir() if _ADAPTER.match(p.name))
    for old in olds[:-KEEP_ADAPTERS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def sim_base_digest(served_model: str) -> str:
    """The simulated base model's digest: it has no files, so a digest of its served name."""
    return "sha256:" + hashlib.sha256(f"haru-sim-base:{served_model}".encode()).hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def adapter_plan(a: argparse.Namespace, p: argparse.ArgumentParser) -> AdapterPlan | None:
    """Validate the adapter flags; None without --adapter-name."""
    companions = a.served_model or a.eval_prompt or a.bad or a.bad_versions
    if not a.adapter_name:
        if companions:
            p.error("--served-model, --eval-prompt, --bad and --bad-versions need --adapter-name")
        return None
    if not name_valid(a.adapter_name):
        p.error("--adapter-name must be lower case letters, digits, '.', '_' or '-' (no '@')")
    if not a.served_model:
        p.error("--adapter-name needs --served-model (the base model's served name)")
    if a.publish_every_s <= 0:
        p.error("--publish-every-s must be positive")
    prompts = tuple(a.eval_prompt or DEFAULT_EVAL_PROMPTS)
    if len(prompts) > MAX_EVAL or any(not q or len(q) > MAX_PROMPT_CHARS for q in prompts):
        p.error(f"at most {MAX_EVAL} --eval-prompt, each 1 to {MAX_PROMPT_CHARS} characters")
    if not 1 <= a.eval_max_tokens <= MAX_EVAL_TOKENS:
        p.error(f"--eval-max-tokens must be from 1 to {MAX_EVAL_TOKENS}")
    if not 0 <= a.bad_error_rate <= 1 or not 0 <= a.bad_latency_ms <= adapters.MAX_LATENCY_MS:
        p.error(f"--bad-error-rate must be 0 to 1, --bad-latency-ms 0 to {adapters.MAX_LATENCY_MS}")
    versions: set[int] = set()
    for raw in (a.bad_versions or "").split(","):
        if raw.strip():
            if not raw.strip().isdigit() or int(raw) < 1:
                p.error("--bad-versions must list version numbers (1 = the first published)")
            versions.add(int(raw))
    flagged = a.bad or bool(versions)
    return AdapterPlan(
        name=a.adapter_name,
        served_model=a.served_model,
        base_reply=a.base_reply or adapters.base_reply(a.served_model),
        prompts=prompts,
        max_tokens=a.eval_max_tokens,
        seed=a.seed,
        bad=adapters.SimBehaviour(a.bad_error_rate, a.bad_latency_ms) if flagged else None,
        bad_versions=frozenset(versions),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m supervisor.sim.trainer")
    p.add_argument("--backend", choices=("sim", "torch"), default="sim", help="torch: real")
    p.add_argument("--checkpoint-every-s", type=float, default=2.0)
    p.add_argument("--step-s", type=float, default=0.1, help="time one training step takes")
    p.add_argument("--memory-mib", type=int, default=0, help="simulated GPU memory to hold")
    p.add_argument("--sigterm-save-s", type=float, default=0.2, help="time the final save takes")
    p.add_argument(
        "--leak-mib",
        type=int,
        default=0,
        help="simulated GPU memory that stays held after this process dies (a leak)",
    )
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--max-steps", type=int, default=0, help="exit 0 after this many (0 = never)")
    p.add_argument("--sim-state", default=os.environ.get("HARU_SIM_GPU_STATE") or None)
    p.add_argument("--dump-env", default=None, help="write the environment to this JSON file")
    g = p.add_argument_group("adapters", "publish servable LoRA adapters (docs/adapters.md)")
    g.add_argument("--adapter-name", default=None, help="publish adapters under this name")
    g.add_argument("--served-model", default=None, help="the base model's served name")
    g.add_argument("--publish-every-s", type=float, default=120.0)
    g.add_argument(
        "--eval-prompt", action="append", default=None, help="repeatable; default: 3 fixed"
    )
    g.add_argument("--eval-max-tokens", type=int, default=16)
    g.add_argument(
        "--base-reply",
        default=None,
        help="the engine's --reply, when it has one (the base answer the manifest records)",
    )
    g.add_argument("--seed", type=int, default=0, help="varies the adapter weights")
    g.add_argument(
        "--bad",
        action="store_true",
        help="publish bad versions: the sim engine serves them with errors and latency",
    )
    g.add_argument(
        "--bad-versions", default=None, help="only these published versions are bad: 2,4"
    )
    # 0.2: the 5th request it serves fails first, after the registry's first probe (three
    # prompts) has passed, so the version reaches a rollout and its gates catch it.
    g.add_argument("--bad-error-rate", type=float, default=0.2)
    g.add_argument("--bad-latency-ms", type=int, default=0)
    a = p.parse_args(argv)
    a.adapter_plan = adapter_plan(a, p)
    return a


def wants_torch(argv: list[str]) -> bool:
    """Whether `--backend torch` was asked for (read before parsing: the two take other flags)."""
    for i, arg in enumerate(argv):
        if arg == "--backend=torch" or (arg == "--backend" and argv[i + 1 : i + 2] == ["torch"]):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_torch(argv):
        try:
            # A real training loop; torch is a heavy optional dependency, loaded only for this.
            from supervisor.sim.backends.torch_trainer import main as torch_main  # noqa: PLC0415
        except ImportError as exc:
            log(f"--backend torch needs torch, transformers, peft and safetensors: {exc}")
            return 2

        return torch_main(argv)
    args = parse_args(argv)
    raw_dir = os.environ.get("HARU_CHECKPOINT_DIR")
    if not raw_dir:
        log("HARU_CHECKPOINT_DIR is not set; the supervisor sets it")
        return 2
    checkpoint_dir = Path(raw_dir)
    gpu_index = int(os.environ.get("HARU_GPU_INDEX", "0"))
    if args.dump_env:
        Path(args.dump_env).write_text(json.dumps(dict(os.environ), sort_keys=True))

    stop = stop_on_sigterm(ignore=args.ignore_sigterm, log=log)

    state = None
    if args.sim_state and (args.memory_mib > 0 or args.leak_mib > 0):
        state = SimGpuState(args.sim_state)
        state.hold(gpu_index, args.memory_mib, "trainer")
        if args.leak_mib > 0:
            state.hold(gpu_index, args.leak_mib, "trainer-leak", leak=True)

    step = newest_step(checkpoint_dir)
    if step:
        log(f"resumed from step {step} ({checkpoint_dir})")
    else:
        log(f"no checkpoint in {checkpoint_dir}; starting at step 0")
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    log(f"training on GPU {gpu_index} (CUDA_VISIBLE_DEVICES={pinned})")
    last_save = last_publish = time.monotonic()
    plan: AdapterPlan | None = args.adapter_plan
    published = 0

    def publish() -> None:
        nonlocal published, last_publish
        assert plan is not None
        published += 1
        path = publish_adapter(checkpoint_dir, step, plan, version=published, now=time.time())
        log(f"published adapter {plan.name} #{published} at step {step}: {path.name}")
        last_publish = time.monotonic()

    try:
        while not stop.wait(args.step_s):
            step += 1
            if time.monotonic() - last_save >= args.checkpoint_every_s:
                write_checkpoint(checkpoint_dir, step, "periodic")
                last_save = time.monotonic()
            if plan is not None and time.monotonic() - last_publish >= args.publish_every_s:
                publish()
            if args.max_steps and step >= args.max_steps:
                write_checkpoint(checkpoint_dir, step, "finished")
                if plan is not None:
                    publish()  # a finished run always leaves its last adapter
                log(f"finished at step {step}")
                return 0
        # SIGTERM: the final save takes a while, as a real one would.
        time.sleep(max(0.0, args.sigterm_save_s))
        path = write_checkpoint(checkpoint_dir, step, "sigterm")
        log(f"SIGTERM: saved step {step} to {path.name}; exiting")
        return 0
    finally:
        if state is not None:
            state.release()


if __name__ == "__main__":
    raise SystemExit(main())
