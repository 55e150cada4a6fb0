"""Benchmark applying a large layout: total time, and the longest a concurrent writer waited.

    .venv/bin/python bench/layout_apply.py [--models 10000] [--batch 500] [--before-ref main~1]

Creates a fresh SQLite database (the embedded default) in a temporary directory, then applies a
two-domain layout of `--models` models per domain three ways, each to a fleet of its own:

- `before`: the one-transaction apply from git ref `--before-ref` (loaded with `git show`), when
  given and the ref still has it;
- `one-batch`: today's code with HARU_LAYOUT_BATCH_ROWS above the row count (one transaction);
- `no-pause`: today's code with `--batch` rows per transaction and no pause between them;
- `batched`: the same with `--pause-ms` between batches (HARU_LAYOUT_BATCH_PAUSE_MS).

While each runs, a probe thread on its own connection writes a row every 10 ms, as a tick's
heartbeat would, and records how long each write waited for the lock. Prints one line per way:
the apply's wall time, its longest write transaction (an upper bound from the commit times; for
a batched apply the first batch includes planning), and the probe's longest wait.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def big_layout(slug: str, models: int, per_slot: int = 50) -> dict[str, Any]:
    """A two-domain layout with `models` models per domain, `per_slot` to a slot."""
    domains = []
    for di, dslug in enumerate(("east", "west")):
        slots = [
            {
                "kind": "inference",
                "gpuIndex": g,
                "models": [
                    {"name": f"m{g}-{i}", "servingUrl": f"http://10.{di}.0.1:{8000 + i}"}
                    for i in range(min(per_slot, models - g * per_slot))
                ],
            }
            for g in range((models + per_slot - 1) // per_slot)
        ]
        domains.append(
            {
                "slug": dslug,
                "provider": "static",
                "priority": 10 * (di + 1),
                "supervisorUrl": f"https://10.{di}.0.1:8701",
                "slots": slots,
            }
        )
    return {"slug": slug, "activeDomainSlug": "east", "domains": domains}


class Probe(threading.Thread):
    """Write one row every 10 ms on its own connection; keep the longest wait."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.db = sqlite3.connect(path, timeout=600, check_same_thread=False)
        self.db.execute("CREATE TABLE IF NOT EXISTS bench_probe (at REAL)")
        self.db.commit()
        self.stop = threading.Event()
        self.longest = 0.0
        self.writes = 0

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT INTO bench_probe VALUES (?)", (started,))
            self.db.commit()
            self.longest = max(self.longest, time.perf_counter() - started)
            self.writes += 1
            time.sleep(0.01)


def before_module(ref: str) -> ModuleType | None:
    """The layouts service as it was at `ref`, or None if git cannot show it."""
    shown = subprocess.run(
        ["git", "show", f"{ref}:fleets/services/layouts.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        return None
    path = Path(tempfile.mkdtemp()) / "layouts_before.py"
    path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location("layouts_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["layouts_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def measure(name: str, apply: Any, slug: str, models: int, db_path: str) -> None:
    from fleets.layouts.loader import parse_layout  # noqa: PLC0415 - needs django.setup() (the app registry) first

    layout = parse_layout(big_layout(slug, models))
    probe = Probe(db_path)
    probe.start()
    time.sleep(0.05)
    from django.conf import settings  # noqa: PLC0415 - needs django.setup() (the app registry) first

    pause_s = settings.HARU["layout_batch_pause_ms"] / 1000
    marks: list[float] = []
    started = time.perf_counter()
    if name == "before":
        report = apply(layout=layout)
    else:
        report = apply(
            layout=layout, on_batch=lambda done, total: marks.append(time.perf_counter())
        )
    took = time.perf_counter() - started
    # The apply's longest batch (lease renewal included), from the commit times: the first is
    # timed from the start, so it includes planning; the one-transaction ways are the whole.
    gaps = [b - a - pause_s for a, b in zip(marks, marks[1:], strict=False)]
    longest = max([*gaps, marks[0] - started] if marks else [took])
    probe.stop.set()
    probe.join()
    batches = getattr(report, "batches", 1) or 1
    print(
        f"{name:10s} models={2 * models:6d} apply={took:7.2f}s batches={batches:4d} "
        f"longest_txn<={longest * 1000:8.1f}ms "
        f"longest_writer_wait={probe.longest * 1000:8.1f}ms probe_writes={probe.writes}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=10_000, help="models per domain")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--pause-ms", type=int, default=100, help="HARU_LAYOUT_BATCH_PAUSE_MS")
    parser.add_argument("--before-ref", default="", help="git ref of the one-transaction apply")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="haru-bench-layout-")
    db_path = os.path.join(tmp, "bench.sqlite3")
    os.environ["DATABASE_URL"] = f"sqlite:///{db_path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    os.environ["HARU_LAYOUT_MAX_ROWS"] = str(10 * args.models + 100)
    import django  # noqa: PLC0415 - after the environment set just above selects the settings

    django.setup()
    from django.conf import settings  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from django.core.management import call_command  # noqa: PLC0415 - needs django.setup() (the app registry) first
    from django.test import override_settings  # noqa: PLC0415 - needs django.setup() (the app registry) first

    from fleets.services.layouts import layout_apply  # noqa: PLC0415 - needs django.setup() (the app registry) first

    call_command("migrate", verbosity=0)
    rows = 2 * (1 + args.models + args.models // 50 + 1)
    if args.before_ref:
        old = before_module(args.before_ref)
        if old is None:
            print(f"before     (git ref {args.before_ref!r} not found; skipped)")
        else:
            measure("before", old.layout_apply, "before", args.models, db_path)
    # Through override_settings: its setting_changed signal is what renews the values code
    # reads (fleets/base/conf.py); a plain assignment would go unseen.
    override_settings(HARU={**settings.HARU, "layout_batch_rows": rows + 10}).enable()
    measure("one-batch", layout_apply, "one", args.models, db_path)
    batch = {"layout_batch_rows": args.batch, "layout_batch_pause_ms": 0}
    override_settings(HARU={**settings.HARU, **batch}).enable()
    measure("no-pause", layout_apply, "nopause", args.models, db_path)
    batch["layout_batch_pause_ms"] = args.pause_ms
    override_settings(HARU={**settings.HARU, **batch}).enable()
    measure("batched", layout_apply, "batched", args.models, db_path)


if __name__ == "__main__":
    main()
