"""One /metrics per host sums what every process counted (prometheus_client multiprocess mode).

The counting processes here are real child processes loading Haru's settings, as a uvicorn
worker or a Celery worker on the same host would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from fleets.metrics.registry import remove_dead_process_files
from fleets.metrics.requests import record

ROOT = Path(__file__).resolve().parents[2]
COUNT_ONCE = """
import django
django.setup()
from fleets.metrics.requests import record
from fleets.metrics.reconcile import SUPERVISOR_CALL_ERRORS, TICKS
record(fleet="f", model="m", outcome="ok", overhead_s=0.001)
TICKS.labels("ok").inc()
SUPERVISOR_CALL_ERRORS.labels("status", "timeout").inc()
"""


def _count_in_child(metrics_dir: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "haru.settings",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    subprocess.run([sys.executable, "-c", COUNT_ONCE], env=env, cwd=ROOT, check=True, timeout=60)


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} ([0-9.e+-]+)$", text, flags=re.M)
    assert match, f"{sample} not in /metrics:\n{text}"
    return float(match.group(1))


@pytest.mark.django_db
def test_two_processes_counting_show_as_one_sum_in_one_scrape(tmp_path, client):
    _count_in_child(tmp_path)
    _count_in_child(tmp_path)

    with override_settings(PROMETHEUS_MULTIPROC_DIR=tmp_path):
        text = client.get("/metrics").content.decode()

    assert _value(text, 'haru_proxy_requests_total{fleet="f",model="m",outcome="ok"}') == 2
    assert _value(text, "haru_proxy_overhead_seconds_count") == 2
    assert _value(text, 'haru_reconcile_ticks_total{outcome="ok"}') == 2
    assert _value(text, 'haru_supervisor_call_errors_total{call="status",kind="timeout"}') == 2
    # The database-derived series are on the same page.
    assert _value(text, "haru_state_store_up") == 1


def test_server_start_removes_only_the_files_of_exited_processes(tmp_path):
    _count_in_child(tmp_path)
    children = sorted(p.name for p in tmp_path.glob("*.db"))
    assert children, "the child wrote no metrics files"
    mine = tmp_path / f"counter_{os.getpid()}.db"
    mine.write_bytes(b"")

    removed = remove_dead_process_files(tmp_path)

    assert removed == len(children)
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [mine.name]


def test_this_process_counts_into_the_configured_directory():
    # prometheus_client chose its value class when first imported: this proves the settings
    # exported the directory before that.
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(settings.PROMETHEUS_MULTIPROC_DIR)
    record(fleet="", model="", outcome="ok")
    assert (settings.PROMETHEUS_MULTIPROC_DIR / f"counter_{os.getpid()}.db").exists()
