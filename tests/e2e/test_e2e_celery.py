"""A real Celery worker and beat on Redis advance a promotion against real supervisors.

The test database is committed (transactional test), so the worker, pointed at the same
PostgreSQL test database, sees the fleet. Nothing in the test process ticks: only beat's
schedule and the worker's follow-up nudges move the operation.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.db import connection

from fleets.base import clock
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


@dataclass(frozen=True)
class Celery:
    dir: Path
    worker: subprocess.Popen
    beat: subprocess.Popen


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
    yield Celery(tmp_path, *procs)
    for proc in procs:
        # The main process only: a warm shutdown lets the pool finish instead of losing it.
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait(5)


def wait_for_worker_heartbeats(fleet) -> None:
    """Beat's ticks heartbeat the fleet: proof the worker reaches the database and supervisors."""
    wait_for(
        lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)),
        30,
        "heartbeats from the Celery worker",
        every=0.2,
    )


def test_celery_beat_and_worker_advance_a_promotion(make_hosts, make_fleet, celery_procs):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    wait_for_worker_heartbeats(fleet)
    target = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation

    def done():
        op.refresh_from_db()
        return op.state not in ("pending", "running")

    try:
        wait_for(done, 30, "the promotion driven by Celery", every=0.2)
    finally:
        worker_log = (celery_procs.dir / "celery-worker.log").read_text(errors="replace")
    assert op.state == "succeeded", (op.error, worker_log[-3000:])
    fleet.refresh_from_db()
    assert fleet.active_domain_id == target.id and fleet.route_revision == 2
    assert Event.objects.filter(operation=op, kind="operation.step.done").count() == 7
    assert "fleets.reconcile_fleet" in worker_log
    assert not Operation.objects.filter(fleet=fleet, state__in=["pending", "running"]).exists()


# What a tick writes from a refused connection: never after its worker began to stop.
_REFUSAL_KINDS = ("operation.step.retry", "operation.failed", "domain.failed", "domain.degraded")


def test_a_worker_stopped_with_its_hosts_writes_nothing_it_saw_after(
    make_hosts, make_fleet, celery_procs
):
    # A promotion waits in stop_training (west's trainer saves for 8 s), so a tick of the pool's
    # child is polling it almost all the time. The worker's main process (systemd's
    # KillMode=mixed), beat and both supervisors are stopped at the same moment: the warm
    # shutdown lets the running tick finish, and that tick must not record west's refusals.
    east, west = make_hosts(west={"trainer_args": ("--sigterm-save-s", "8"), "grace_ms": 10_000})
    fleet = make_fleet(east, west, {"stopTrainingTimeoutMs": 30_000, "trainingStopGraceMs": 10_000})
    wait_for_worker_heartbeats(fleet)
    target = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation
    assert op is not None

    def polling() -> bool:
        op.refresh_from_db()
        return op.current_step == "stop_training" and op.step_started_at is not None

    wait_for(polling, 30, "the promotion in stop_training", every=0.1)
    wait_for(lambda: (clock.now() - op.step_started_at).total_seconds() > 1.5, 5, "a poll")
    stopped_at = clock.now()
    for pid in (celery_procs.worker.pid, celery_procs.beat.pid):
        os.kill(pid, signal.SIGTERM)
    for host in (east, west):
        assert host.proc is not None
        kill_group(host.proc.pid, signal.SIGTERM)
    celery_procs.worker.wait(40)

    worker_log = (celery_procs.dir / "celery-worker.log").read_text(errors="replace")
    after = list(
        Event.objects.filter(
            fleet=fleet, created_at__gt=stopped_at, kind__in=_REFUSAL_KINDS
        ).values_list("kind", "data")
    )
    assert after == [], (after, worker_log[-3000:])
    op.refresh_from_db()
    assert (op.state, op.current_step) == ("running", "stop_training")
    assert Operation.objects.filter(fleet=fleet).count() == 1
