"""`python -m supervisor.sim.trainer`: a simulated trainer that honours Haru's trainer contract.

- resumes from the newest `step-NNNNNN.json` in HARU_CHECKPOINT_DIR and says which step;
- writes a checkpoint every few seconds, atomically (write, fsync, rename);
- holds simulated GPU memory on HARU_GPU_INDEX while it runs (and with `--leak-mib`, some that
  stays held after it dies, to test the supervisor's pre-wake memory check);
- with `--backend torch`, trains a real LoRA adapter instead (`backends/torch_trainer.py`);
- on SIGTERM saves within `--sigterm-save-s` and exits 0, or with `--ignore-sigterm` keeps
  going, so the supervisor's SIGKILL path can be tested.

Standard library only (Python 3.9+): it runs under whatever `python3` the command names.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from supervisor.gpu.sim_state import SimGpuState
from supervisor.sim.backends import stop_on_sigterm

_CHECKPOINT = re.compile(r"^step-(\d+)\.json$")
KEEP_CHECKPOINTS = 3


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
    return p.parse_args(argv)


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
    last_save = time.monotonic()
    try:
        while not stop.wait(args.step_s):
            step += 1
            if time.monotonic() - last_save >= args.checkpoint_every_s:
                write_checkpoint(checkpoint_dir, step, "periodic")
                last_save = time.monotonic()
            if args.max_steps and step >= args.max_steps:
                write_checkpoint(checkpoint_dir, step, "finished")
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
