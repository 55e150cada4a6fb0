"""Real processes for the browser tests: the Haru server, two supervisors with simulated engines
and trainers, and headless Chromium (Debian's package, driven by Playwright).

Nothing is shared with pytest-django's test database: the server is a subprocess, so it gets a
database of its own (a SQLite file in a temp dir, or `<DATABASE_URL name>_browser` on Postgres),
migrated and seeded by the real management commands. Every process runs in its own process
group and is killed at teardown, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from playwright.sync_api import sync_playwright

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path(os.environ.get("HARU_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USERNAME = "operator"


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, OSError, ValueError, KeyError, TypeError) as exc:
            last, value = exc, None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


class Processes:
    """Start processes in their own groups, logging to files; kill every group at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.extra_pids: set[int] = set()

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def cleanup(self) -> None:
        # SIGTERM first: supervisors stop their engines and trainers on the way out.
        for _, proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 8
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for pgid in [p.pid for _, p in self.procs] + sorted(self.extra_pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for pid in sorted(self.extra_pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for _, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=3)


def base_env() -> dict[str, str]:
    """The parent's environment minus every Haru/database/Redis setting (set explicitly)."""
    drop = ("HARU_", "DATABASE_URL", "REDIS_URL", "PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ----------------------------------------------------------------------------------------------
# Layout and supervisor configs, rewritten for free ports and a private temp dir
# ----------------------------------------------------------------------------------------------


def supervisor_config(host: str, tmp: Path, model_ports: dict[str, int]) -> dict:
    config = json.loads((ROOT / "examples" / f"supervisor-{host}.json").read_text())
    config["gpu"]["simStateFile"] = str(tmp / host / "sim-gpu.json")
    for slot in config["slots"]:
        if slot["kind"] == "inference":
            for model in slot["models"]:
                model["port"] = model_ports[model["name"]]
        else:
            # The interpreter that runs the tests has the repo importable; `python3` may not.
            slot["command"] = [sys.executable, *slot["command"][1:]]
            slot["checkpointDir"] = str(tmp / host / "checkpoints")
    return config


def layout(sup_ports: dict[str, int], configs: dict[str, dict]) -> dict:
    """The two-domain example, pointed at our ports, with each model's engine profile copied
    from its supervisor's config (so the profile-drift flag has something to compare)."""
    data = json.loads((ROOT / "examples" / "fleet.two-domain.json").read_text())
    # Operator-driven in this test: nothing should fail over on its own.
    data["policy"]["autoFailover"] = False
    for domain in data["domains"]:
        host = domain["slug"]
        domain["supervisorUrl"] = f"http://127.0.0.1:{sup_ports[host]}"
        ports = {}
        profiles = {}
        for slot in configs[host]["slots"]:
            for model in slot.get("models", []):
                ports[model["name"]] = model["port"]
                profiles[model["name"]] = model["profile"]
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                model["servingUrl"] = f"http://127.0.0.1:{ports[model['name']]}"
                model["profile"] = profiles[model["name"]]
        domain["servingBaseUrl"] = f"http://127.0.0.1:{ports['qwen-small']}"
    return data


# ----------------------------------------------------------------------------------------------
# The database of the server under test
# ----------------------------------------------------------------------------------------------


def _postgres_admin(url: str):
    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    return psycopg.connect(admin, autocommit=True)


@contextlib.contextmanager
def server_database(tmp: Path) -> Iterator[dict[str, str]]:
    """Yield the env that gives the server a fresh database of its own; drop it afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        yield {"HARU_VAR_DIR": str(tmp / "var")}
        return
    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'haru'}_browser"
    with _postgres_admin(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {
            "DATABASE_URL": urlunsplit(parts._replace(path=f"/{name}")),
            "HARU_VAR_DIR": str(tmp / "var"),
        }
    finally:
        with _postgres_admin(url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ----------------------------------------------------------------------------------------------
# The portal: server + supervisors, the demo fleet seeded and in standby posture
# ----------------------------------------------------------------------------------------------


@dataclass
class Portal:
    url: str
    password: str
    lane: str  # database + channel layer, e.g. "sqlite+memory", "postgres+redis"
    procs: Processes
    tmp: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, trust_env=False)

    def fleet(self, slug: str = "demo") -> dict:
        with self.api() as api:
            return api.get(f"/v1/fleets/{slug}").raise_for_status().json()

    def domain(self, slug: str, fleet: str = "demo") -> dict:
        return next(d for d in self.fleet(fleet)["domains"] if d["slug"] == slug)


def _manage(env: dict[str, str], *args: str, timeout: float = 180) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        command = " ".join(args)
        raise AssertionError(f"manage.py {command} failed:\n{result.stdout}\n{result.stderr}")


def _start_supervisor(procs: Processes, host: str, config: dict, port: int, token: str) -> None:
    env = {
        **base_env(),
        "PORT": str(port),
        "HARU_SUPERVISOR_CONFIG": json.dumps(config),
        "HARU_SUPERVISOR_TOKEN": token,
    }
    procs.start(f"supervisor-{host}", [sys.executable, "-m", "supervisor"], env)


def _adopt_children(procs: Processes, url: str, token: str) -> None:
    """Remember the engines' and trainers' PIDs, so teardown kills them even if a supervisor
    dies first (they run in process groups of their own)."""
    with httpx.Client(base_url=url, timeout=5, trust_env=False) as c:
        body = c.get("/v1/status", headers={"Authorization": f"Bearer {token}"}).json()
    for slot in body.get("slots", []):
        for model in slot.get("models") or []:
            pid = (model.get("process") or {}).get("pid")
            if pid:
                procs.extra_pids.add(pid)
        for pid in (slot.get("training") or {}).get("pids") or []:
            procs.extra_pids.add(pid)


@pytest.fixture(scope="module")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(
            f"headless Chromium not found at {CHROMIUM}: install Debian's package "
            "(`apt-get install -y chromium`; .ci/run does) or set HARU_CHROMIUM"
        )
    return CHROMIUM


@pytest.fixture(scope="module")
def portal(chromium_path, tmp_path_factory) -> Iterator[Portal]:
    tmp = tmp_path_factory.mktemp("portal")
    (tmp / "logs").mkdir()
    procs = Processes(tmp / "logs")
    token = secrets.token_urlsafe(24)
    password = secrets.token_urlsafe(12)
    redis_url = os.environ.get("REDIS_URL") or ""
    with server_database(tmp) as db_env, contextlib.ExitStack() as stack:
        stack.callback(procs.cleanup)
        env = {**base_env(), **db_env}
        if redis_url:
            env["REDIS_URL"] = redis_url
        lane = ("postgres" if "DATABASE_URL" in db_env else "sqlite") + (
            "+redis" if redis_url else "+memory"
        )

        # 1. Two supervisors (each starts its simulated engines itself).
        sup_ports = {"east": free_port(), "west": free_port()}
        configs = {
            host: supervisor_config(
                host, tmp, {"qwen-small": free_port(), "llama-small": free_port()}
            )
            for host in ("east", "west")
        }
        for host in ("east", "west"):
            _start_supervisor(procs, host, configs[host], sup_ports[host], token)

        # 2. The server's database: migrated and seeded with the real commands, plus a staff user.
        layout_path = tmp / "fleet.json"
        layout_path.write_text(json.dumps(layout(sup_ports, configs), indent=2))
        _manage(env, "migrate", "--noinput")
        _manage(env, "seed_layout", "--config", str(layout_path))
        if os.environ.get("HARU_DOCS_SCREENSHOTS"):
            _seed_unreachable_fleet(env, tmp)
        _manage(
            {
                **env,
                "DJANGO_SUPERUSER_USERNAME": USERNAME,
                "DJANGO_SUPERUSER_PASSWORD": password,
                "DJANGO_SUPERUSER_EMAIL": "operator@example.com",
            },
            "createsuperuser",
            "--noinput",
        )

        for host, port in sup_ports.items():
            url = f"http://127.0.0.1:{port}"
            wait_for(
                lambda url=url: (
                    httpx.get(
                        f"{url}/v1/ready", headers={"Authorization": f"Bearer {token}"}, timeout=2
                    ).json()["stateKnown"]
                    is True
                ),
                timeout=40,
                what=f"supervisor {host} ready\n{procs.log_tail(f'supervisor-{host}')}",
            )
            _adopt_children(procs, url, token)

        # 3. The server. Without Redis it runs the reconcile loop in-process (the embedded
        # default); with Redis the loop runs in a separate process, so every change reaches
        # the browser through channels_redis, as it would from a Celery worker.
        port = free_port()
        server_env = {**env, "HARU_SUPERVISOR_TOKEN": token, "HARU_RECONCILE_INTERVAL_MS": "500"}
        procs.start(
            "server", [sys.executable, "manage.py", "serve", "--port", str(port)], server_env
        )
        if redis_url:
            procs.start(
                "reconciler",
                [sys.executable, "manage.py", "reconcile", "--loop", "--interval-ms", "300"],
                server_env,
            )
        portal = Portal(f"http://127.0.0.1:{port}", password, lane, procs, tmp)
        wait_for(
            lambda: httpx.get(f"{portal.url}/healthz", timeout=2).status_code == 200,
            timeout=30,
            what=f"server up\n{procs.log_tail('server')}",
        )

        # 4. Standby posture: both domains seen, then demote west (its models sleep and its
        # trainer starts), which is where a failover starts from.
        wait_for(
            lambda: all(d["lastSeenAt"] for d in portal.fleet()["domains"]),
            timeout=30,
            what=f"first heartbeats\n{procs.log_tail('server')}",
        )
        with portal.api() as api:
            answer = api.post("/v1/fleets/demo/demote", json={"targetDomainId": "west"})
            assert answer.status_code == 202, answer.text
            op_id = answer.json()["operation"]["id"]
            wait_for(
                lambda: api.get(f"/v1/operations/{op_id}").json()["state"] == "succeeded",
                timeout=60,
                what=f"demotion of west\n{procs.log_tail('server')}",
            )
            if os.environ.get("HARU_DOCS_SCREENSHOTS"):
                # Some history for the failover chart: two round trips before the test's own.
                for target in ("west", "east", "west", "east"):
                    answer = api.post("/v1/fleets/demo/promote", json={"targetDomainId": target})
                    assert answer.status_code == 202, answer.text
                    op_id = answer.json()["operation"]["id"]
                    wait_for(
                        lambda op_id=op_id: (
                            api.get(f"/v1/operations/{op_id}").json()["state"] == "succeeded"
                        ),
                        timeout=60,
                        what=f"promotion of {target}\n{procs.log_tail('server')}",
                    )
        _adopt_children(procs, f"http://127.0.0.1:{sup_ports['west']}", token)
        _adopt_children(procs, f"http://127.0.0.1:{sup_ports['east']}", token)
        portal.extra.update(sup_ports=sup_ports, token=token, env=env, configs=configs)
        yield portal


def _seed_unreachable_fleet(env: dict[str, str], tmp: Path) -> None:
    """For the overview screenshot: a second fleet whose hosts do not answer (closed ports)."""
    data = json.loads((ROOT / "examples" / "fleet.two-domain.json").read_text())
    data.update(slug="staging", displayName="Staging (hosts unreachable)")
    data["policy"]["autoFailover"] = False
    for domain in data["domains"]:
        domain["supervisorUrl"] = f"http://127.0.0.1:{free_port()}"
    path = tmp / "staging.json"
    path.write_text(json.dumps(data))
    _manage(env, "seed_layout", "--config", str(path))


@pytest.fixture(scope="module")
def browser(chromium_path):
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(chromium_path), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
