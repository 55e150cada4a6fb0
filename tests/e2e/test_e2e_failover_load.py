"""bench/failover_load.py --quick: the stack starts, clients run, every kind reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """Run bench/failover_load.py with `args`, outside any HARU_ setting of this process."""
    return subprocess.run(
        [sys.executable, "bench/failover_load.py", *args],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("HARU_")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_load_bench_runs_briefly_and_what_this_build_guarantees_holds():
    result = bench("--quick", "--kinds", "planned,supervisor-off")
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    sections = dict(re.findall(r"== (\S+): \d+ round\(s\)\n\s+failed/total\s+(\d+/\d+)", out))
    assert set(sections) == {"planned", "supervisor-off"}
    for kind, counts in sections.items():
        failed, total = map(int, counts.split("/"))
        assert total > 50, (kind, out[-2000:])  # eight clients really ran
        # A planned promotion cuts no request; a dead supervisor stops no traffic.
        assert failed == 0, (kind, out[-3000:])
    assert "client-visible outage ms" in out and "wake ms" in out


def test_the_stream_continuation_run_runs_briefly_with_its_clients_in_processes():
    # Its stall target is a benchmark figure (never asserted here); what every run guarantees:
    # each stream in flight at the kill continued whole and byte-identical.
    result = bench("--streams", "8", "--tokens", "40", "--client-processes", "3", "--json")
    out = result.stdout
    last = out.strip().splitlines()[-1:] or [""]
    assert last[0].startswith("{"), out[-3000:] + result.stderr[-3000:]
    figures = json.loads(last[0])
    assert figures["streams"] == 8 and figures["in_flight_at_kill"] == 8, out[-3000:]
    assert figures["cut"] == 0 and figures["failed"] == 0, out[-3000:]
    assert figures["identical_share"] == 1.0 and figures["stalls_measured"] == 8, out[-3000:]
