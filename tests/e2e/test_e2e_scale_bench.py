"""bench/scale.py: its figures from the hosts' side, and one tiny run end to end (the farm,
fleets seeded through the layout service, a reconcile worker, an injected failover)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scale import FIELDS, print_table
from bench.scale_measure import percentile, tick_lateness

ROOT = Path(__file__).resolve().parents[2]
# The issue's names, each a key of every run (None where a figure was not measured).
ISSUE_FIELDS = (
    "fleets",
    "workers",
    "interval_s",
    "tick_lateness_p99_s",
    "cpu_s_per_fleet_minute",
    "rows_written_per_idle_heartbeat",
    "lease_rows_per_tick",
    "idle_tick_cpu_ms",
    "idle_tick_statements",
    "overview_ms",
    "fleet_list_ms",
    "metrics_ms",
    "double_ticks",
    "handover_s",
    "lease_s",
    "failover_failed_requests",
)


def test_lateness_is_each_gap_beyond_the_interval_and_a_silent_host_is_late_by_the_window():
    heard = {"a": [10.0, 15.0, 22.5, 27.0], "b": [11.0]}
    late, silent = tick_lateness(heard, ["a", "b", "c"], t0=10.0, t1=30.0, interval_s=5.0)
    # a: gaps 0, 5, 7.5, 4.5, 3 -> 2.5 late once; b: 1, 19 -> 14 late; c: never heard, 20 s.
    assert sorted(late) == [0, 0, 0, 0, 0, 2.5, 14.0, 15.0]
    assert silent == 1
    assert percentile(late, 50) == 0
    assert percentile(late, 99) == 15.0
    assert percentile([], 99) is None


def test_the_table_says_not_measured_rather_than_a_number(capsys):
    run = dict.fromkeys(FIELDS)
    run.update(fleets=10, workers=2, metrics_ms=12.5)
    print_table([run])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["metrics_ms"].endswith("12.5")
    assert lines["handover_s"].endswith("not measured")


@pytest.mark.integration
@pytest.mark.postgres
@pytest.mark.redis
def test_a_tiny_run_ends_with_one_json_line_holding_every_field(tmp_path):
    server = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    redis_server = os.environ["REDIS_URL"].rsplit("/", 1)[0]
    argv = [
        sys.executable, "bench/scale.py", "--sizes", "2", "--workers", "1",
        "--interval-s", "1", "--seconds", "3", "--json",
        "--database-url", f"{server}/haru_scale_test", "--redis-url", f"{redis_server}/11",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    [run] = result["runs"]
    assert set(ISSUE_FIELDS) <= set(run)
    assert (run["fleets"], run["workers"], run["interval_s"]) == (2, 1, 1.0)
    assert run["fleets_never_heard"] == 0
    assert run["tick_lateness_p99_s"] is not None
    assert run["cpu_s_per_fleet_minute"] > 0
    assert run["pg_connections_max"] >= 1
    # The injected failover moved routing; no request started after the crash was lost.
    assert run["failover_total_s"] >= run["failover_detection_s"] > 0
    assert run["failover_requests"] > 0
    assert run["failover_failed_requests"] == 0  # of those started after the crash
    assert run["failover_failed_in_flight"] <= 4  # at most one running per client
