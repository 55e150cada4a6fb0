"""bench/server_edges.py --protocol-only runs and compares all three protocols (it once broke
silently: the chat path needs Django's app registry, and its first request was a chat one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_protocol_only_bench_compares_stock_the_supervisor_and_the_server(tmp_path):
    result = subprocess.run(
        [sys.executable, "bench/server_edges.py", "--protocol-only", "--rounds", "1"]
        + ["--requests", "50"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HARU_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.stdout.splitlines()[-1]
    assert summary.startswith("summary: protocol CPU per request")
    for name in ("stock", "supervisor", "haru"):
        assert f" {name} " in summary, summary
