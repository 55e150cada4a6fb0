"""What a local Haru with a broker adds: Celery workers and beat, and a PostgreSQL cluster and
a redis-server of its own (to stop, restart and stall without touching a shared one)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from common.ports import free_port

from . import PYTHON
from .processes import exited, spawn, wait_for
from .server import environment


def start_celery(
    name: str, args: list[str], *, env: dict[str, str], workdir: Path
) -> subprocess.Popen:
    """Start `celery -A haru <args>` with `env` over a clean environment, its var dir and log
    (`<name>.log`) in `workdir`."""
    full = environment(("HARU_",), **env)
    full["HARU_VAR_DIR"] = str(workdir / name / "var")
    (workdir / name).mkdir(parents=True, exist_ok=True)
    return spawn(
        [PYTHON, "-m", "celery", "-A", "haru", *args], env=full, log=workdir / f"{name}.log"
    )


def celery_worker_args(name: str, concurrency: int = 1) -> list[str]:
    """A worker's arguments: one named consumer, without the chatter between workers."""
    return [
        "worker", "--loglevel", "INFO", "--concurrency", str(concurrency), "--without-gossip",
        "--without-mingle", "--without-heartbeat", "--hostname", f"{name}@%h",
    ]  # fmt: skip


def celery_beat_args(schedule: Path) -> list[str]:
    # DEBUG for the "sent. id->..." line: it ties a tick a worker ran to the beat that sent it.
    return ["beat", "--loglevel", "DEBUG", "--schedule", str(schedule)]


# -- PostgreSQL ------------------------------------------------------------------------------


def postgres_bin() -> Path | None:
    """Return the directory of initdb/pg_ctl: on PATH, else the newest Debian-style install."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(versions[-1]).parent if versions else None


def _version(path: str) -> tuple[int, ...]:
    number = Path(path).parent.parent.name
    return tuple(int(p) for p in number.split(".") if p.isdigit())


def why_no_own_postgres() -> str | None:
    """Why a PostgreSQL cluster of one's own cannot run here, or None."""
    if postgres_bin() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0:
        # initdb refuses to run as root: the cluster belongs to the postgres user.
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres user: initdb refuses root"
        if shutil.which("runuser") is None:
            return "running as root without runuser: initdb refuses root"
    return None


class OwnPostgres:
    """A throwaway PostgreSQL cluster in a temporary directory, trust auth, on a port of its
    own; `init()` creates and starts it. As root it runs as the `postgres` user."""

    def __init__(self, port: int | None = None) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError(why_no_own_postgres())
        self.bindir = bindir
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="haru-own-pg-"))
        self.dir.chmod(0o755)
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def root(self) -> Path:
        return self.dir

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            cwd=self.dir,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"{tool}: {result.stdout}{result.stderr}")

    def init(self) -> OwnPostgres:
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        return self.start()

    def start(self) -> OwnPostgres:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
            "start",
        )  # fmt: skip
        wait_for(self._answers, 30, "own postgres")
        return self

    def _answers(self) -> bool:
        self.sql("SELECT 1")
        return True

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> float:
        """Restart with `-m fast` (every connection is terminated); return seconds it took."""
        started = time.monotonic()
        self.stop("fast")
        self.start()
        return time.monotonic() - started

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, query: str, params: tuple = (), db: str = "postgres") -> list[tuple]:
        with psycopg.connect(self.url(db), autocommit=True, connect_timeout=10) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def create_database(self, name: str) -> None:
        self.sql(f'CREATE DATABASE "{name}"')

    def pids(self) -> list[int]:
        """Return the postmaster and every process it started (backends, checkpointer, ...)."""
        master = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [master]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    stat = (entry / "stat").read_text()
                    if int(stat[stat.rindex(")") + 2 :].split()[1]) == master:
                        pids.append(int(entry.name))
        return pids

    def signal_all(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.signal_all(signal.SIGCONT)
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


# -- Redis -----------------------------------------------------------------------------------


class OwnRedis:
    """A redis-server of one's own, which a caller may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> OwnRedis:
        log_path = self.dir / "redis.log"
        argv = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.dir),
        ]  # fmt: skip
        self.proc = spawn(argv, env=dict(os.environ), log=log_path, cwd=self.dir)
        wait_for(self.up, 10, "redis-server up", gave_up=exited(self.proc, log_path))
        return self

    def up(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
            return True
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def flush(self) -> None:
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "flushall"], check=True, capture_output=True
        )
