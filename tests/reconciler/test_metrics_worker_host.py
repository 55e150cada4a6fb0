"""A worker host without a server replica: `manage.py metrics_host` serves its processes' series.

The counting processes are real children loading Haru's settings, as Celery workers on that
host would; the endpoint is the real command, scraped over HTTP.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from common.ports import free_port
from haru.local.processes import wait_for
from tests.reconciler.test_metrics_across_processes import COUNT_ONCE, _count_in_child, _value

ROOT = Path(__file__).resolve().parents[2]
# A worker that counted and still runs (until its stdin closes), as a Celery worker would.
COUNT_AND_STAY = COUNT_ONCE + "\nprint('counted', flush=True)\nimport sys\nsys.stdin.read()\n"


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - a local test URL
            return answer.read().decode()
    except OSError:
        return None


def test_metrics_host_sums_its_hosts_processes_and_leaves_the_database_series_to_the_servers(
    tmp_path,
):
    _count_in_child(tmp_path)  # exited before the endpoint starts: its files go (a reset)
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "haru.settings",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", COUNT_AND_STAY],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for worker in workers:
        assert worker.stdout.readline().strip() == "counted"
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "metrics_host", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        text = wait_for(lambda: _scrape(url), 60, "metrics_host answering")
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
        for worker in workers:
            worker.communicate(timeout=20)
    assert proc.returncode == 0, output

    assert _value(text, 'haru_reconcile_ticks_total{outcome="ok"}') == 2
    assert _value(text, 'haru_supervisor_call_errors_total{call="status",kind="timeout"}') == 2
    # Families no process touched yet are declared, as on a server's /metrics.
    assert "# TYPE haru_reconcile_tick_duration_seconds histogram" in text
    # Nothing read from the database: the server replicas export that once.
    assert not re.search(r"^haru_(state_store_up|domain_state|operations_total)", text, re.M)
