"""`manage.py serve`: loopback only and a loud warning without a token; refuses anything else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from common.loopback import is_loopback
from common.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_VARS = {"DATABASE_URL", "REDIS_URL", "PORT", "HARU_API_TOKEN", "HARU_RECONCILE_INTERVAL_MS"}


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    env.update(HARU_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gpu-portal.example", False),
    ],
)
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.integration
@pytest.mark.parametrize("token", [None, "   "], ids=["unset", "blank"])
@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5"])
def test_serve_refuses_a_non_loopback_bind_without_a_token(tmp_path, token, host):
    extra = {"HARU_API_TOKEN": token} if token is not None else {}
    result = subprocess.run(
        [sys.executable, "manage.py", "serve", "--host", host, "--port", str(free_port())],
        cwd=ROOT,
        env=server_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"refusing to bind {host} without HARU_API_TOKEN" in result.stderr


@pytest.fixture
def started(tmp_path):
    """Start `manage.py serve` in its own process group; always kill the group afterwards."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, **env: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"serve-{len(procs)}.log"
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", *args],
            cwd=ROOT,
            env=server_env(tmp_path, **env),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        return proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def wait_for_healthz(proc: subprocess.Popen, url: str, log: Path) -> httpx.Response:
    """Poll until the server answers (a readiness wait, not a timing assertion)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"serve never answered {url}:\n{log.read_text()}")


@pytest.mark.integration
def test_serve_without_a_token_binds_loopback_and_warns(started):
    port = free_port()
    proc, log = started(PORT=str(port))  # PORT from the environment, no --host
    response = wait_for_healthz(proc, f"http://127.0.0.1:{port}/healthz", log)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    output = log.read_text()
    assert f"haru serving on http://127.0.0.1:{port}" in output
    assert "HARU_API_TOKEN is not set" in output
    assert "UNAUTHENTICATED" in output
