"""Real processes for the server tests: `manage.py serve`, a fast model-server double, and a
PostgreSQL cluster of the test's own (to stop and SIGSTOP without touching a shared one)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_VARS = ("DATABASE_URL", "REDIS_URL", "PORT", "HARU_")
MODEL = "edge-model"


def wait_for(predicate, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling, report the last
            last, value = exc, None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


# ---------------------------------------------------------------------------------------------
# A fast upstream: one OpenAI-shaped JSON answer per request, on a thread of its own.

_ANSWER = json.dumps({"choices": [{"index": 0, "message": {"content": "pong"}}]}).encode()


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one request (head and Content-Length body) off a test upstream's connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(_ANSWER), _ANSWER)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def start_upstream(handler=_answer) -> tuple[int, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port_box: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(handler, "127.0.0.1", 0))
        port_box.append(server.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    return port_box[0], loop


def layout(slug: str, upstream_port: int) -> dict:
    serving = f"http://127.0.0.1:{upstream_port}"
    return {
        "slug": slug,
        "activeDomainSlug": "main",
        "domains": [
            {
                "slug": "main",
                "provider": "static",
                "servingBaseUrl": serving,
                "slots": [
                    {
                        "kind": "inference",
                        "gpuIndex": 0,
                        "models": [{"name": MODEL, "servingUrl": serving}],
                    }
                ],
            }
        ],
    }


# ---------------------------------------------------------------------------------------------
# manage.py


def server_env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SERVER_VARS)}
    env.update(HARU_VAR_DIR=str(work / "var"), PYTHONUNBUFFERED="1", **extra)
    return env


def manage(env: dict[str, str], *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"manage.py {args[0]}: {result.stdout}{result.stderr}"


def prepare(env: dict[str, str], work: Path, data: dict, staff: tuple[str, str] | None = None):
    """Migrate, seed the layout and optionally create a staff login, as an operator would."""
    path = work / "layout.json"
    path.write_text(json.dumps(data))
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "seed_layout", "--config", str(path))
    if staff:
        manage(
            {**env, "DJANGO_SUPERUSER_PASSWORD": staff[1]},
            "createsuperuser",
            "--noinput",
            "--username",
            staff[0],
            "--email",
            "ops@example.invalid",
        )


class Serve:
    """`manage.py serve` in its own process group; `stop()` kills the group."""

    def __init__(self, env: dict[str, str], work: Path, preexec_fn=None) -> None:
        self.port = free_port()
        self.log = work / f"serve-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(self.port)]
            + ["--no-reconcile-loop"],
            cwd=ROOT,
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited:\n{self.log.read_text()}")
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"serve never answered:\n{self.log.read_text()}") from None
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


# ---------------------------------------------------------------------------------------------
# A PostgreSQL cluster of our own


def staff_client(url: str, staff: tuple[str, str]) -> httpx.Client:
    """An httpx client logged in through the login form as `staff` (username, password)."""
    client = httpx.Client(base_url=url, timeout=20)
    client.get("/login/")
    client.post(
        "/login/",
        data={
            "username": staff[0],
            "password": staff[1],
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{url}/login/"},
    )
    assert "sessionid" in client.cookies, "staff login failed"
    return client


def own_postgres_possible() -> bool:
    """initdb is here and, as root (PostgreSQL refuses root), a `postgres` user to run it as."""
    if postgres_bin() is None:
        return False
    if os.geteuid() != 0:
        return True
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return shutil.which("runuser") is not None


# Set by .ci/run (tests/fault reads it too): a test that needs a cluster of its own fails
# where none can run, instead of skipping, so CI cannot go green without having run it.
REQUIRED_ENV = "HARU_FAULT_REQUIRED"


def require_own_postgres() -> None:
    """Skip where a throwaway PostgreSQL cannot run here; fail instead when REQUIRED_ENV=1."""
    if own_postgres_possible():
        return
    why = "needs PostgreSQL's initdb (and, as root, a postgres user and runuser)"
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1, and this test cannot run here: {why}")
    pytest.skip(why)


def postgres_bin() -> Path | None:
    """The directory of initdb/pg_ctl: on PATH, else the newest Debian-style install."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


class OwnPostgres:
    """A throw-away cluster on `port`, trust auth, in a temporary directory.

    PostgreSQL refuses to run as root: as root, the cluster runs as the `postgres` user.
    """

    def __init__(self, port: int) -> None:
        bindir = postgres_bin()
        assert bindir is not None
        self.bindir = bindir
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="haru-own-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            cwd=self.root,
        )
        assert result.returncode == 0, f"{tool}: {result.stdout}{result.stderr}"

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        wait_for(self._answers, 30, "own postgres")

    def _answers(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "stop", "-m", "immediate", "-w")

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, ...)."""
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
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def free_port_in(first: int, last: int) -> int:
    """A free port in [first, last] (this project's helpers each own a port range)."""
    for port in range(first, last + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {first}-{last}")
