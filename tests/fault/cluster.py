"""A whole deployment the fault tests may break: its own PostgreSQL cluster and redis-server
(so they can be stopped, restarted and stalled without touching anyone else's), the server, two
Celery workers, beat, and two supervisors with simulated engines, all started by the local
launcher (haru/local/).

Every process runs in its own session and is killed by process group at teardown; the database
cluster and Redis are stopped at the end of the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from celery import Celery

from haru.local.backing import (
    OwnPostgres,
    OwnRedis,
    celery_beat_args,
    celery_worker_args,
    postgres_bin,
    start_celery,
)
from haru.local.layouts import fleet_layout
from haru.local.processes import kill_group, wait_for
from haru.local.relay import CutRelay
from haru.local.server import ServerProc, environment, manage
from haru.local.supervisors import TOKEN, SimHost, put_in_standby_posture
from tests.fault.chat_load import ChatLoad

__all__ = ["OwnPostgres", "OwnRedis"]

PG_BIN = postgres_bin()
# Short enough that a takeover shows within seconds, long enough for a loaded CI machine's
# heartbeat round plus one step call between checkpoints.
LEASE_MS = 5000
INTERVAL_MS = 500
# The steps every promotion records; the two best-effort ones on the old active are skipped
# when it is dead (an auto-failover from a crashed host).
REQUIRED_STEPS = {"stop_training", "verify_gpu", "wake", "probe", "switch_route"}
# Set by .ci/run: a missing tool fails the suite instead of skipping it, so CI cannot go green
# without having run it.
REQUIRED_ENV = "HARU_FAULT_REQUIRED"
# Beat's DEBUG line for each task it sent, with the id a worker's log names again when it runs it.
BEAT_SENT = re.compile(r"fleets\.reconcile_all sent\. id->([0-9a-f-]+)")


def tools_missing() -> str | None:
    """Why the suite cannot run here, or None."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: initdb refuses root"
    return None


def require_tools() -> None:
    """Skip the suite where it cannot run; fail it instead where HARU_FAULT_REQUIRED=1."""
    missing = tools_missing()
    if missing is None:
        return
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1, and the fault suite cannot run here: {missing}")
    pytest.skip(missing)


# A domain's last good heartbeat as Haru reads it (`fleets/reads/sightings.py`): the later of
# the row's and the sighting kept on its fleet's tick lease (GREATEST skips a NULL).
LAST_SEEN_SQL = (
    "SELECT d.slug, GREATEST(d.last_seen_at, (l.sightings ->> d.id::text)::timestamptz) "
    "FROM fleets_domain d LEFT JOIN fleets_lease l ON l.name = 'tick:' || d.fleet_id::text"
)


class Deployment:
    """One fleet over two simulated hosts, driven by the server, two Celery workers and beat."""

    def __init__(
        self,
        workdir: Path,
        pg: OwnPostgres,
        redis: OwnRedis,
        template: str,
        policy: dict,
        env: dict[str, str | None] | None = None,
        *,
        relay: bool = False,
    ) -> None:
        """`relay`: reach east's supervisor through a relay the test can cut (`self.relay`)."""
        self.dir = workdir
        self.pg = pg
        self.redis = redis
        self.db = f"fault_{uuid.uuid4().hex[:10]}"
        pg.sql(f'CREATE DATABASE "{self.db}" TEMPLATE "{template}"')
        redis.flush()
        self.east = SimHost("east", workdir)
        self.west = SimHost("west", workdir, start_asleep=True)
        self.east.start()
        self.west.start()
        put_in_standby_posture(self.west)
        self.env = {
            "DATABASE_URL": pg.url(self.db),
            "REDIS_URL": redis.url,
            "HARU_RECONCILE_INTERVAL_MS": str(INTERVAL_MS),
            "HARU_TICK_LEASE_MS": str(LEASE_MS),
            "HARU_SUPERVISOR_TOKEN": TOKEN,
        }
        # A test's own settings; None drops one of the suite's, leaving Haru's default.
        for key, value in (env or {}).items():
            if value is None:
                self.env.pop(key, None)
            else:
                self.env[key] = value
        self.server = ServerProc(workdir, env=self.env)
        # Named, so pg_stat_activity tells the server's connections from the workers'.
        self.server.env["DATABASE_URL"] = self.app_url("server")
        layout = workdir / "layout.json"
        fleet = fleet_layout(self.east, self.west, policy)
        self.relay: CutRelay | None = None
        if relay:
            self.relay = CutRelay(self.east.port).start()
            fleet["domains"][0]["supervisorUrl"] = self.relay.url
        layout.write_text(json.dumps(fleet))
        self.server.manage("seed_layout", "--config", str(layout))
        self.workers: dict[str, subprocess.Popen] = {}
        self.beat: subprocess.Popen | None = None
        self.loads: list[ChatLoad] = []
        self.server.start()
        for name in ("w1", "w2"):
            self.start_worker(name)
        self.start_beat()
        wait_for(self.heartbeats_in, 60, "heartbeats of both domains", every=0.2)
        # Each process once: `assert_recovered` proves the same ones still run after a fault.
        self.started = self._processes()

    # -- processes -------------------------------------------------------------------------

    def _celery(self, name: str, args: list[str]) -> subprocess.Popen:
        env = {**self.env, "DATABASE_URL": self.app_url(name)}
        return start_celery(name, args, env=env, workdir=self.dir)

    def start_worker(self, name: str) -> None:
        self.workers[name] = self._celery(name, celery_worker_args(name))

    def start_beat(self) -> None:
        self.beat = self._celery("beat", celery_beat_args(self.dir / "beat-schedule"))

    def _processes(self) -> dict[str, subprocess.Popen]:
        assert self.server.proc is not None and self.beat is not None
        return {"server": self.server.proc, **self.workers, "beat": self.beat}

    def start_chat(self, *, clients: int = 4, pause_s: float = 0.1) -> ChatLoad:
        """Start chat traffic through the server's proxy; return once a request was served."""
        load = ChatLoad(
            f"{self.server.url}/v1", self.server.api_token, "e2e", clients=clients, pause_s=pause_s
        ).start()
        self.loads.append(load)
        wait_for(lambda: load.served() >= clients, 30, "chat requests served before the fault")
        return load

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tasks_done(self, name: str) -> int:
        """How many reconcile tasks worker `name` has finished (its log, one child each).

        Every kind counts: which worker's consumer takes each per-fleet `reconcile_fleet` (a
        kick) or `reconcile_batch` (the beat's ticks, sent by `reconcile_all` in batches) is up
        to the broker (one worker can take all of them for a while under load), while the
        beat's `reconcile_all` reaches each worker in turn; any one finished proves the worker
        consumes and ticks again.
        """
        pattern = r"Task fleets\.reconcile_(?:fleet|all|batch)\[[^\]]+\] succeeded"
        return len(re.findall(pattern, self.log(name)))

    def hold_eta_ticks(self, count: int = 2) -> list[str]:
        """Queue `count` ticks of the fleet due in 10 minutes; return once workers hold them.

        A worker keeps a message with an ETA unacknowledged until it runs it, as it does the
        follow-ups a waiting step queues (fleets/tasks.py `celery_kicker`).
        """
        fleet_id = str(self.q("SELECT id FROM fleets_fleet")[0][0])
        with Celery("fault-suite", broker=self.redis.url) as sender:
            ids = [
                sender.send_task("fleets.reconcile_fleet", args=[fleet_id], countdown=600).id
                for _ in range(count)
            ]

        def held() -> bool:
            logs = "".join(self.log(name) for name in self.workers)
            return all(f"Task fleets.reconcile_fleet[{i}] received" in logs for i in ids)

        wait_for(held, 20, "the workers holding the ETA ticks")
        return ids

    # -- recovery ----------------------------------------------------------------------------

    def beat_ticked_since(self, offset: int) -> bool:
        """Whether a worker finished a `reconcile_all` that beat sent after `offset` in its log.

        Nothing but beat sends `reconcile_all` (its schedule row, fleets/services/schedule.py),
        so one sent after the fault and run to the end proves beat, the broker and a worker all
        came back.
        """
        sent = BEAT_SENT.findall(self.log("beat")[offset:])
        logs = "".join(self.log(name) for name in self.workers)
        return any(f"Task fleets.reconcile_all[{task_id}] succeeded" in logs for task_id in sent)

    def assert_recovered(self, what: str, since: float | None = None) -> dict[str, float]:
        """Prove every process came back from the fault by itself.

        The same server, workers and beat that started still run (none was restarted), the
        server answers, each worker finishes a tick it took after this call, and beat sends a
        tick after this call that a worker runs. Returns the seconds until each of those
        ("server", each worker's name, "beat"), counted from `since` (a `time.monotonic()`,
        the fault's end) or from this call.
        """
        for name, proc in self.started.items():
            assert proc.poll() is None, f"{name} exited ({proc.returncode}) after {what}"
        assert self._processes() == self.started, f"a process was replaced after {what}"
        start = time.monotonic() if since is None else since
        beat_offset = len(self.log("beat"))
        done = {name: self.tasks_done(name) for name in self.workers}
        seconds: dict[str, float] = {}
        wait_for(self.server_healthy, 20, f"the server answering after {what}")
        seconds["server"] = time.monotonic() - start
        for name, count in done.items():
            wait_for(
                lambda n=name, c=count: self.tasks_done(n) > c, 30, f"{name} ticking after {what}"
            )
            seconds[name] = time.monotonic() - start
        wait_for(lambda: self.beat_ticked_since(beat_offset), 30, f"a beat tick run after {what}")
        seconds["beat"] = time.monotonic() - start
        return seconds

    def teardown(self) -> None:
        for load in self.loads:
            load.stop()
        for proc in [*self.workers.values(), self.beat]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                kill_group(proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        self.server.kill()
        if self.relay is not None:
            self.relay.stop()
        self.east.crash()
        self.west.crash()
        with contextlib.suppress(Exception):
            self.pg.sql(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    # -- state, read straight from the database ---------------------------------------------

    def q(self, query: str, params: tuple = ()) -> list[tuple]:
        return self.pg.sql(query, params, db=self.db)

    def last_seen(self) -> dict[str, datetime | None]:
        """Each domain's last good heartbeat by slug: the later of its row's `last_seen_at` and
        the sighting on its fleet's tick lease (a heartbeat that changed nothing writes no
        domain row, `fleets/reads/sightings.py`), as Haru itself reads it."""
        return dict(self.q(LAST_SEEN_SQL))

    def heartbeats_in(self) -> bool:
        seen = self.last_seen()
        return len(seen) == 2 and all(at is not None for at in seen.values())

    def heartbeats_after(self, moment: datetime) -> bool:
        """Whether both domains were heartbeated (observed) after `moment` (aware, UTC)."""
        seen = self.last_seen()
        return len(seen) == 2 and all(at is not None and at > moment for at in seen.values())

    def app_url(self, process: str) -> str:
        """The database URL for one process, its connections named `fault-<process>`."""
        return f"{self.pg.url(self.db)}?application_name=fault-{process}"

    def connections(self, process: str | None = None) -> int:
        """Connections to this deployment's database: of one process (by name), or of all."""
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        params: tuple = (self.db,)
        if process is not None:
            query += " AND application_name = %s"
            params = (self.db, f"fault-{process}")
        return self.pg.sql(query, params)[0][0]

    def revision(self) -> int:
        return self.q("SELECT route_revision FROM fleets_fleet")[0][0]

    def active_slug(self) -> str:
        return self.q(
            "SELECT d.slug FROM fleets_fleet f JOIN fleets_domain d ON d.id = f.active_domain_id"
        )[0][0]

    def domain_id(self, slug: str) -> str:
        return str(self.q("SELECT id FROM fleets_domain WHERE slug = %s", (slug,))[0][0])

    def operation(self, op_id: str) -> dict:
        row = self.q(
            "SELECT state, current_step, routing_committed FROM fleets_operation WHERE id = %s",
            (op_id,),
        )[0]
        return {"state": row[0], "step": row[1], "routingCommitted": row[2]}

    def operations(self) -> list[tuple]:
        return self.q("SELECT id, kind, state, reason FROM fleets_operation ORDER BY created_at")

    def lease_holder(self) -> str:
        rows = self.q("SELECT holder FROM fleets_lease WHERE name LIKE 'tick:%%'")
        return rows[0][0] if rows else ""

    def steps_done(self, op_id: str) -> list[str]:
        return [
            r[0]
            for r in self.q(
                "SELECT step FROM fleets_event WHERE operation_id = %s AND kind = "
                "'operation.step.done' ORDER BY id",
                (op_id,),
            )
        ]

    def promote(self, slug: str = "west") -> str:
        response = self.server.api(
            "POST", "/fleets/e2e/promote", {"targetDomainId": self.domain_id(slug)}
        )
        assert response.status_code == 202, response.text
        return response.json()["operation"]["id"]

    def assert_invariants(self, promotions: int) -> None:
        """Routing moved once per succeeded promotion; nothing stuck; every step once."""
        ops = self.operations()
        assert not [o for o in ops if o[2] in ("pending", "running")], ops
        succeeded = [o for o in ops if o[1] == "promote" and o[2] == "succeeded"]
        assert len(succeeded) == promotions, ops
        assert self.revision() == 1 + promotions
        for op in succeeded:
            steps = self.steps_done(str(op[0]))
            assert len(steps) == len(set(steps)), steps  # no step recorded twice
            assert set(steps) >= REQUIRED_STEPS, steps  # none lost
            if op[3] != "auto_failover":  # a planned one also sleeps the old active: all seven
                assert len(steps) == 7, steps

    def server_healthy(self) -> bool:
        return httpx.get(f"{self.server.url}/healthz", timeout=5, trust_env=False).is_success


def pid_of(holder: str) -> int:
    """The PID in a lease holder id (`host:pidns:pid:nonce`)."""
    return int(holder.rsplit(":", 2)[1])


def prepare_template(pg: OwnPostgres, workdir: Path) -> str:
    """Migrate one database to copy for each test (migrations take longer than a copy)."""
    name = "fault_template"
    pg.sql(f'CREATE DATABASE "{name}"')
    env = environment(
        ("HARU_", "REDIS_URL"),
        DATABASE_URL=pg.url(name),
        HARU_VAR_DIR=str(workdir / "var"),
        HARU_RECONCILE_INTERVAL_MS=str(INTERVAL_MS),  # seeds beat's schedule
    )
    manage(env, "migrate", "--noinput", "-v0", timeout=300)
    return name
