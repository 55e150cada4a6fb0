"""Fixtures for the supervisor's tests: free ports, real processes that are always cleaned up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from common.ports import free_port
from common.wire.contract import check_response
from supervisor.api import create_app
from supervisor.config import parse_config
from supervisor.gpu.nvml import NvmlBackend
from supervisor.host import Host, HostDeps
from tests.supervisor.fakes import FakeModelServers, FakeNvml, FakeSpawner

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "integration: starts real processes (supervisor, sim engines, trainers); runs by default",
    )


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last error: {last_error!r})")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARU_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ProcessTracker:
    """Start processes in their own groups and kill every group at teardown.

    Leaked processes hold ports and break other engineers' tests, so cleanup is unconditional:
    SIGTERM, a short wait, then SIGKILL to the whole group, plus any extra pids registered.
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.extra_pids: set[int] = set()

    def start(self, argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=kwargs.pop("cwd", REPO_ROOT),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            **kwargs,
        )
        self.procs.append(proc)
        return proc

    def adopt(self, pid: int | None) -> None:
        """Register a grandchild (e.g. a managed engine) to be killed at teardown too."""
        if pid:
            self.extra_pids.add(pid)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for pgid in [p.pid for p in self.procs] + sorted(self.extra_pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)


@pytest.fixture
def processes() -> Iterator[ProcessTracker]:
    tracker = ProcessTracker()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture(scope="module")
def module_processes() -> Iterator[ProcessTracker]:
    tracker = ProcessTracker()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@dataclass
class SimServer:
    port: int
    model: str
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_sim(
    tracker: ProcessTracker, model: str, *args: str, env: dict[str, str] | None = None
) -> SimServer:
    """Start `python -m supervisor.sim` on a free port and wait until it is healthy."""
    port = free_port()
    proc = tracker.start(
        [sys.executable, "-m", "supervisor.sim", "--port", str(port), "--model", model, *args],
        env=child_env(env),
    )
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200)
    return SimServer(port, model, proc)


@dataclass
class SupervisorProcess:
    port: int
    token: str | None
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        # Every answer a real supervisor process gives in a test is checked against the schemas.
        return httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout,
            trust_env=False,
            event_hooks={"response": [check_response]},
        )


def start_supervisor(
    tracker: ProcessTracker,
    config: dict[str, Any],
    *,
    token: str | None = "test-token-0123456789",
    extra_env: dict[str, str] | None = None,
    wait_ready: bool = True,
    port: int | None = None,
) -> SupervisorProcess:
    """Start `python -m supervisor` with an inline config and wait for /healthz.

    Pass the `port` of a supervisor that died to restart it: the default state dir is per port.
    """
    port = port or free_port()
    env = child_env(
        {"PORT": str(port), "HARU_SUPERVISOR_CONFIG": json.dumps(config), **(extra_env or {})}
    )
    if token:
        env["HARU_SUPERVISOR_TOKEN"] = token
    proc = tracker.start([sys.executable, "-m", "supervisor"], env=env)
    sup = SupervisorProcess(port, token, proc)
    wait_for(lambda: httpx.get(f"{sup.url}/healthz", timeout=1).status_code == 200, timeout=15)
    if wait_ready:
        with sup.client() as c:
            wait_for(lambda: c.get("/v1/ready").json()["stateKnown"], timeout=15)
            for slot in c.get("/v1/status").json()["slots"]:
                for model in slot.get("models", ()):
                    tracker.adopt((model.get("process") or {}).get("pid"))
    return sup


@pytest.fixture(scope="session")
def tools() -> SimpleNamespace:
    """Helpers for tests, handed out as a fixture (importing from conftest is fragile)."""
    return SimpleNamespace(
        repo_root=REPO_ROOT,
        free_port=free_port,
        wait_for=wait_for,
        child_env=child_env,
        start_sim=start_sim,
        start_supervisor=start_supervisor,
    )


class ApiUnderTest:
    """An in-process supervisor app over scripted I/O (no processes, no sockets)."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        token: str | None = None,
        servers: dict[int, Any] | None = None,
        spawner: Any = None,
        gpu: Any = None,
        cwd: Path = REPO_ROOT,
    ) -> None:

        self.servers = FakeModelServers(servers or {})
        self.spawner = spawner or FakeSpawner()
        transport = httpx.MockTransport(self.servers)

        async def never_in_use(port: int) -> bool:
            return False

        self.host = Host(
            parse_config(config, cwd=cwd),
            HostDeps(
                gpu=gpu or NvmlBackend(load=lambda: FakeNvml([], init_error=12)),
                spawner=self.spawner,
                environ={"PATH": "/usr/bin", "HARU_SUPERVISOR_TOKEN": token or "unset"},
                http_factory=lambda: httpx.AsyncClient(transport=transport),
                port_in_use=never_in_use,
            ),
        )
        self.app = create_app(self.host, token=token)


@pytest.fixture
def api() -> Callable[..., ApiUnderTest]:
    """Build an in-process supervisor; use `TestClient(result.app)` as a context manager."""
    return ApiUnderTest
