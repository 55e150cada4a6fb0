"""A real Celery worker and beat on Redis advance a promotion against real supervisors.

The test database is committed (transactional test), so the worker, pointed at the same
PostgreSQL test database, sees the fleet. Nothing in the test process ticks: only beat's
schedule and the worker's follow-up nudges move the operation.
"""

from __future__ import annotations

import os
import signal
import subprocess
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.db import connection

from fleets.models import Domain, Event, Operation
from fleets.services.operations import operation_request
from fleets.services.schedule import beat_schedule_seed
from tests.e2e.harness import PYTHON, REPO, TOKEN, kill_group, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def celery_procs(tmp_path):
    """Start `celery -A haru worker` and `celery -A haru beat` against the test database."""

    redis_url = settings.HARU["redis_url"]
    redis.Redis.from_url(redis_url).flushdb()  # our own db number: drop stale tasks
    parts = urlsplit(os.environ["DATABASE_URL"])
    env = {
        **os.environ,
        "DATABASE_URL": urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"])),
        "REDIS_URL": redis_url,
        "HARU_RECONCILE_INTERVAL_MS": "300",
        "HARU_SUPERVISOR_TOKEN": TOKEN,
        "HARU_VAR_DIR": str(tmp_path / "var"),
    }
    # Beat reads its schedule from the database: the test's 300 ms, not the seeded default.
    beat_schedule_seed(reconcile_interval_ms=300, reset=True)
    procs = []
    for args in (
        [
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
            "--without-gossip",
            "--without-mingle",
        ],
        ["beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")],
    ):
        log = open(tmp_path / f"celery-{args[0]}.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [PYTHON, "-m", "celery", "-A", "haru", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    yield tmp_path
    for proc in procs:
        # The main process only: a warm shutdown lets the pool finish instead of losing it.
        os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait(5)


def test_celery_beat_and_worker_advance_a_promotion(make_hosts, make_fleet, celery_procs):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    # Beat's ticks heartbeat the fleet: proof the worker reaches the database and supervisors.
    wait_for(
        lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)),
        30,
        "heartbeats from the Celery worker",
        every=0.2,
    )
    target = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation

    def done():
        op.refresh_from_db()
        return op.state not in ("pending", "running")

    try:
        wait_for(done, 30, "the promotion driven by Celery", every=0.2)
    finally:
        worker_log = (celery_procs / "celery-worker.log").read_text(errors="replace")
    assert op.state == "succeeded", (op.error, worker_log[-3000:])
    fleet.refresh_from_db()
    assert fleet.active_domain_id == target.id and fleet.route_revision == 2
    assert Event.objects.filter(operation=op, kind="operation.step.done").count() == 7
    assert "fleets.reconcile_fleet" in worker_log
    assert not Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists()
