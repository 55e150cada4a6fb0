"""The Haru server of a local Haru: its environment, the `manage.py` steps that prepare its
database (migrate, seed a layout, a staff login) and `manage.py serve` itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from common.ports import free_port

from . import PYTHON, REPO
from .processes import NotReady, exited, kill_group, log_tail, spawn, stop, wait_for
from .supervisors import TOKEN

# What a server's environment never inherits from the caller's: it is given explicitly.
SERVER_VARS = ("DATABASE_URL", "REDIS_URL", "PORT", "HARU_")
# Creates or updates a staff login (`createsuperuser` refuses one that exists).
_STAFF_SCRIPT = """\
import os
from django.contrib.auth import get_user_model
u, _ = get_user_model().objects.get_or_create(username=os.environ['DJANGO_SUPERUSER_USERNAME'])
u.is_staff = u.is_superuser = True
u.set_password(os.environ['DJANGO_SUPERUSER_PASSWORD'])
u.save()
"""


class CommandFailed(AssertionError):
    """A `manage.py` step that exited non-zero (an AssertionError, so a test reports it)."""


def environment(drop: tuple[str, ...] = SERVER_VARS, /, **extra: str) -> dict[str, str]:
    """Return this process's environment without the variables starting with `drop`, plus
    `extra` and unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def server_env(workdir: Path, **extra: str) -> dict[str, str]:
    """A server's environment: nothing inherited of SERVER_VARS, its var dir in `workdir`."""
    return environment(HARU_VAR_DIR=str(workdir / "var"), **extra)


def manage(
    env: dict[str, str], *args: str, timeout: float = 180, capture: bool = True
) -> subprocess.CompletedProcess:
    """Run `manage.py <args>`; raise CommandFailed with its output if it fails. `capture=False`
    leaves the output on this process's terminal."""
    result = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=capture,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        output = f"\n{result.stdout}{result.stderr}" if capture else ""
        raise CommandFailed(f"manage.py {args[0]} exited with {result.returncode}{output}")
    return result


def seed_layout(env: dict[str, str], path: Path, data: dict | None = None) -> None:
    """Apply the layout at `path` (written there first when `data` is given)."""
    if data is not None:
        path.write_text(json.dumps(data, indent=1))
    manage(env, "seed_layout", "--config", str(path))


def ensure_staff(env: dict[str, str], username: str, password: str) -> None:
    """Create the staff user `username` with `password`, or update the one that exists."""
    # The names createsuperuser reads: a child that is only ever this one-off shell.
    staff = {**env, "DJANGO_SUPERUSER_USERNAME": username, "DJANGO_SUPERUSER_PASSWORD": password}
    manage(staff, "shell", "-c", _STAFF_SCRIPT)


def prepare(
    env: dict[str, str], workdir: Path, layout: dict, staff: tuple[str, str] | None = None
) -> None:
    """Migrate, seed the layout and optionally create a staff login, as an operator would."""
    manage(env, "migrate", "--noinput", "-v", "0")
    seed_layout(env, workdir / "layout.json", layout)
    if staff:
        ensure_staff(env, *staff)


class Server:
    """`manage.py serve` on `port`, in its own session, logging to `log_path`."""

    def __init__(self, env: dict[str, str], log_path: Path, *, port: int | None = None) -> None:
        self.env = env
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, *args: str, preexec_fn: Callable[[], Any] | None = None) -> subprocess.Popen:
        """Start the server without waiting for it (`wait_ready` does)."""
        argv = [PYTHON, "manage.py", "serve", "--port", str(self.port), *args]
        self.proc = spawn(argv, env=self.env, log=self.log_path, preexec_fn=preexec_fn)
        return self.proc

    def wait_ready(self, timeout: float = 20) -> None:
        if self.proc is None:
            raise RuntimeError("the server was not started: spawn() first")
        gave_up = exited(self.proc, self.log_path)
        wait_for(self.healthy, timeout, "server /healthz", gave_up=gave_up)

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2, trust_env=False).status_code == 200

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM (the server drains), then SIGKILL what is left after `grace_s`."""
        if self.proc is not None:
            stop(self.proc, grace_s)

    def output(self, lines: int | None = None) -> str:
        """The server's log, or its last `lines` lines."""
        if lines is not None:
            return log_tail(self.log_path, lines)
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Serve(Server):
    """`manage.py serve` without the reconcile loop, started at once on a free port: the edge
    the server tests and benchmarks measure. `log` is its log file."""

    def __init__(
        self,
        env: dict[str, str],
        workdir: Path,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        port = free_port()
        super().__init__(env, workdir / f"serve-{port}.log", port=port)
        self.log = self.log_path
        self.spawn("--no-reconcile-loop", preexec_fn=preexec_fn)
        self.wait_ready(60)


def staff_client(url: str, staff: tuple[str, str]) -> httpx.Client:
    """Return an httpx client logged in through the login form as `staff` (username,
    password)."""
    client = httpx.Client(base_url=url, timeout=20, trust_env=False)
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
    if "sessionid" not in client.cookies:
        raise NotReady(f"the staff login as {staff[0]} failed")
    return client


class ServerProc(Server):
    """`manage.py serve` with its own var dir, API token, supervisor token and a fast reconcile
    loop (the embedded one unless `env` names a broker)."""

    def __init__(self, workdir: Path, *, env: dict[str, str]) -> None:
        self.dir = workdir / "server"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.api_token = "e2e-api-token-0123456789abcdefghijklmn"
        full = {
            **environment(("HARU_",)),
            "HARU_VAR_DIR": str(self.dir / "var"),
            "HARU_API_TOKEN": self.api_token,
            "HARU_SUPERVISOR_TOKEN": TOKEN,
            "HARU_RECONCILE_INTERVAL_MS": "200",
            **env,
        }
        if "REDIS_URL" not in env:
            full.pop("REDIS_URL", None)  # the embedded loop, not Celery
        super().__init__(full, self.dir / "server.log")

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def start(self, *args: str) -> ServerProc:
        self.spawn(*args)
        self.wait_ready(20)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc, 10, sig)
        elif self.proc is not None:
            kill_group(self.proc.pid)

    def api(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.url}/v1{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.api_token}"},
            timeout=30,
            trust_env=False,
        )

    def log(self) -> str:
        return self.output()
