"""Benchmark how long and how much memory `seed_layout` takes to refuse or accept a huge layout.

    .venv/bin/python bench/layout_size.py [--models 20000] [--variants all] [--json]

Writes layouts of `--models` models (padded to about 3.96 MiB each, just under the default
HARU_LAYOUT_MAX_BYTES) in a temporary directory and runs `manage.py seed_layout --config FILE
--dry-run` on each in a child process of its own, against a fresh migrated SQLite database.
Prints, per variant, the child's wall time and CPU time, its peak resident memory (`ru_maxrss`
from `wait4`, so the figure is that child's own), its exit status, the file's size and what it
printed (size, first and last line). Variants:

- `valid`: one planned domain of 1,024 GPUs, 20 models (memoryMiB 1) to a slot: accepted.
- `spread`: the same with one model per slot: refused, too much to plan (each unpinned slot is
  weighed against every GPU; the planner bounds that work).
- `one-slot`: every model in one slot on GPU 0: refused, it does not fit (one refusal whose
  label names the slot).
- `missing-memory`: as `one-slot` without memoryMiB: one refusal per model, each naming the
  slot (the finding: each message listed every model, 87 s and 13.2 GB for 19,000).
- `bad-names`: every model name upper case: one schema error per model.
- `too-many-rows`: `valid` under the default HARU_LAYOUT_MAX_ROWS (20,000: the models with their
  slots and domain, 21,001 rows, are over it): refused before it is checked or planned. The
  others run with the limit raised to its most, so they are planned.

The target (issue 29): a 4 MiB layout of 20,000 models refused or accepted in at most 10 s and
1 GiB. A dry run plans and diffs against the database like a real apply, without the writes
(whose time `bench/layout_apply.py` measures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Each file is padded (in its models' modelPath) to about this size: just under the default
# HARU_LAYOUT_MAX_BYTES (4 MiB), the largest layout the loader takes.
TARGET_BYTES = 4_150_000


def _model(i: int, *, memory: bool, upper: bool, pad: int) -> dict[str, Any]:
    name = f"model-{i:05d}"
    out: dict[str, Any] = {
        "name": name.upper() if upper else name,
        "servingUrl": f"http://10.0.{i // 250}.{i % 250 + 1}:8000",
        "profile": {"engine": "sim", "modelPath": f"/models/{name}/" + "w" * pad},
    }
    if memory:
        out["memoryMiB"] = 1
    return out


def layout(variant: str, models: int, pad: int = 0) -> dict[str, Any]:
    """The layout of one variant (module docstring)."""
    memory = variant != "missing-memory"
    upper = variant == "bad-names"
    every = [_model(i, memory=memory, upper=upper, pad=pad) for i in range(models)]
    # 1,024 GPUs (the planner's most), 64 to an entry (the schema's most).
    gpus = [{"count": 64, "type": "H100", "memoryMiB": 81559} for _ in range(16)]
    if variant == "spread":
        slots: list[dict[str, Any]] = [{"kind": "inference", "models": [m]} for m in every]
    elif variant in {"valid", "too-many-rows"}:
        # 20 models to a slot, planned on whichever GPU fits.
        slots = [{"kind": "inference", "models": every[i : i + 20]} for i in range(0, models, 20)]
    else:
        # The finding's shape: every model in one slot.
        slots = [{"kind": "inference", "gpuIndex": 0, "models": every}]
    domain: dict[str, Any] = {
        "slug": "east",
        "provider": "static",
        "supervisorUrl": "http://10.0.0.1:8701",
        "gpus": gpus,
        "slots": slots,
    }
    return {"slug": f"big-{variant}", "activeDomainSlug": "east", "domains": [domain]}


VARIANTS = ("valid", "spread", "one-slot", "missing-memory", "bad-names", "too-many-rows")


def run_child(config: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run one dry-run `seed_layout` and measure it (wall time, its own peak RSS)."""
    argv = [sys.executable, "manage.py", "seed_layout", "--config", str(config), "--dry-run"]
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    # Streamed, keeping the ends only: a parent that held a 200 MB report would lend that
    # memory to the next child's ru_maxrss (Linux keeps the high-water mark across fork).
    size, count, first, last = 0, 0, b"", b""
    for line in proc.stdout:
        size, count = size + len(line), count + 1
        first = first or line[:400]
        last = line[:400]
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [x.decode("utf-8", "replace").rstrip("\n") for x in (first, last) if x]
    return {
        "wall_s": round(took, 2),
        # CPU seconds of the child alone: steadier than wall time on a shared machine.
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "exit": proc.returncode,
        "output_lines": count,
        "output_bytes": size,
        "first_line": lines[0][:160] if lines else "",
        "last_line": lines[-1][:160] if lines else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=20_000)
    parser.add_argument("--variants", default="all", help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--write", nargs=2, metavar=("VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        # In a child of its own: a parent that built the layout would lend its memory to the
        # next child's ru_maxrss (Linux keeps the high-water mark across fork and exec).
        variant, path = args.write
        bare = len(json.dumps(layout(variant, args.models)))
        pad = max(0, (TARGET_BYTES - bare) // max(args.models, 1))
        Path(path).write_text(json.dumps(layout(variant, args.models, pad)))
        return
    variants = VARIANTS if args.variants == "all" else tuple(args.variants.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="haru-bench-layout-size-"))
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp / 'bench.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "haru.settings",
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
    )
    results = []
    try:
        for variant in variants:
            path = tmp / f"{variant}.json"
            subprocess.run(
                [sys.executable, __file__, "--models", str(args.models), "--write", variant, path],
                check=True,
            )
            # Every variant but the last is planned: the row limit (default 20,000, which
            # 20,000 models and their slot and domain pass) is raised to its most for them.
            rows = {} if variant == "too-many-rows" else {"HARU_LAYOUT_MAX_ROWS": "1000000"}
            row = {"variant": variant, "file_mib": round(path.stat().st_size / 2**20, 2)}
            row.update(run_child(path, {**env, **rows}))
            results.append(row)
            if not args.json:
                print(
                    f"{variant:15s} file={row['file_mib']:5.2f}MiB wall={row['wall_s']:7.2f}s "
                    f"cpu={row['cpu_s']:7.2f}s "
                    f"peak_rss={row['peak_rss_mib']:8.1f}MiB exit={row['exit']} "
                    f"lines={row['output_lines']} bytes={row['output_bytes']}\n"
                    f"{'':15s} {row['first_line']}\n{'':15s} {row['last_line']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps({"models": args.models, "results": results}, indent=2))


if __name__ == "__main__":
    main()
