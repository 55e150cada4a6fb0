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
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from playwright.sync_api import sync_playwright

from common.ports import free_port
from haru.local import REPO as ROOT
from haru.local.layouts import TWO_DOMAIN_EXAMPLE, example_supervisor_config, two_domain_layout
from haru.local.processes import Processes, wait_for
from haru.local.server import ensure_staff, environment, seed_layout
from haru.local.server import manage as _manage
from haru.local.supervisors import start_supervisor, supervisor_children, supervisor_ready

__all__ = ["ROOT", "USERNAME", "_manage", "free_port", "wait_for"]

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
HOSTS = ("east", "west")


def base_env() -> dict[str, str]:
    """The parent's environment minus every Haru/database/Redis setting (set explicitly)."""
    return environment(PYTHONPATH=str(ROOT))


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


def _start_supervisors(procs: Processes, tmp: Path, token: str, env: dict[str, str]):
    """Start both example hosts' supervisors (each starts its simulated engines itself) on free
    ports; return (their ports, their configs)."""
    sup_ports = {host: free_port() for host in HOSTS}
    configs = {
        host: example_supervisor_config(
            host, tmp, {"qwen-small": free_port(), "llama-small": free_port()}
        )
        for host in HOSTS
    }
    for host in HOSTS:
        name = f"supervisor-{host}"
        config = json.dumps(configs[host])
        log = procs.log_path(name)
        proc = start_supervisor(port=sup_ports[host], config=config, token=token, log=log, env=env)
        procs.add(name, proc)
    return sup_ports, configs


def _prepare_database(env: dict[str, str], tmp: Path, layout: dict, password: str) -> None:
    """Migrate and seed with the real commands, plus a staff user."""
    _manage(env, "migrate", "--noinput")
    seed_layout(env, tmp / "fleet.json", layout)
    if os.environ.get("HARU_DOCS_SCREENSHOTS"):
        _seed_unreachable_fleet(env, tmp)
    ensure_staff(env, USERNAME, password)


def _wait_supervisors(procs: Processes, sup_ports: dict[str, int], token: str) -> None:
    for host, port in sup_ports.items():
        url = f"http://127.0.0.1:{port}"
        what = f"supervisor {host} ready\n{procs.log_tail(f'supervisor-{host}')}"
        wait_for(lambda url=url: supervisor_ready(url, token), timeout=40, what=what)
        procs.adopt(supervisor_children(url, token))


def _start_server(
    procs: Processes, env: dict[str, str], token: str, lane: str, tmp: Path, password: str
) -> Portal:
    """Start the server. Without Redis it runs the reconcile loop in-process (the embedded
    default); with Redis the loop runs in a separate process, so every change reaches the
    browser through channels_redis, as it would from a Celery worker."""
    port = free_port()
    server_env = {**env, "HARU_SUPERVISOR_TOKEN": token, "HARU_RECONCILE_INTERVAL_MS": "500"}
    procs.start("server", [sys.executable, "manage.py", "serve", "--port", str(port)], server_env)
    if "REDIS_URL" in env:
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
    return portal


def _operation_succeeded(api: httpx.Client, answer: httpx.Response, what: str, log: str) -> None:
    assert answer.status_code == 202, answer.text
    op_id = answer.json()["operation"]["id"]
    wait_for(
        lambda: api.get(f"/v1/operations/{op_id}").json()["state"] == "succeeded",
        timeout=60,
        what=f"{what}\n{log}",
    )


def _standby_posture(portal: Portal) -> None:
    """Both domains seen, then demote west (its models sleep and its trainer starts), which is
    where a failover starts from."""
    procs = portal.procs
    wait_for(
        lambda: all(d["lastSeenAt"] for d in portal.fleet()["domains"]),
        timeout=30,
        what=f"first heartbeats\n{procs.log_tail('server')}",
    )
    with portal.api() as api:
        answer = api.post("/v1/fleets/demo/demote", json={"targetDomainId": "west"})
        _operation_succeeded(api, answer, "demotion of west", procs.log_tail("server"))
        if os.environ.get("HARU_DOCS_SCREENSHOTS"):
            # Some history for the failover chart: two round trips before the test's own.
            for target in ("west", "east", "west", "east"):
                answer = api.post("/v1/fleets/demo/promote", json={"targetDomainId": target})
                what = f"promotion of {target}"
                _operation_succeeded(api, answer, what, procs.log_tail("server"))


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
    """The server and two supervisors, the demo fleet seeded and in standby posture."""
    tmp = tmp_path_factory.mktemp("portal")
    (tmp / "logs").mkdir()
    procs = Processes(tmp / "logs")
    token = secrets.token_urlsafe(24)
    password = secrets.token_urlsafe(12)
    redis_url = os.environ.get("REDIS_URL") or ""
    with server_database(tmp) as db_env, contextlib.ExitStack() as stack:
        stack.callback(procs.cleanup)
        env = {**base_env(), **db_env, **({"REDIS_URL": redis_url} if redis_url else {})}
        lane = ("postgres" if "DATABASE_URL" in db_env else "sqlite") + (
            "+redis" if redis_url else "+memory"
        )
        sup_ports, configs = _start_supervisors(procs, tmp, token, base_env())
        _prepare_database(env, tmp, two_domain_layout(sup_ports, configs), password)
        _wait_supervisors(procs, sup_ports, token)
        portal = _start_server(procs, env, token, lane, tmp, password)
        _standby_posture(portal)
        for port in sup_ports.values():
            procs.adopt(supervisor_children(f"http://127.0.0.1:{port}", token))
        portal.extra.update(sup_ports=sup_ports, token=token, env=env, configs=configs)
        yield portal


def _seed_unreachable_fleet(env: dict[str, str], tmp: Path) -> None:
    """For the overview screenshot: a second fleet whose hosts do not answer (closed ports)."""
    data = json.loads(TWO_DOMAIN_EXAMPLE.read_text())
    data.update(slug="staging", displayName="Staging (hosts unreachable)")
    data["policy"]["autoFailover"] = False
    for domain in data["domains"]:
        domain["supervisorUrl"] = f"http://127.0.0.1:{free_port()}"
    seed_layout(env, tmp / "staging.json", data)


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
