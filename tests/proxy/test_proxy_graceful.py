"""Graceful restart of a real `manage.py serve` process: SIGTERM drains, never drops.

The server gets a request in flight (a slow model server) and a held one (a model whose server
refuses connections), then SIGTERM: /readyz turns 503 at once while /healthz stays 200, the
request in flight finishes 200, the held one is answered 503 with Retry-After at the end of the
drain budget, the listener closes, and the process exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from common.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVER_VARS = {"DATABASE_URL", "REDIS_URL", "PORT", "HARU_API_TOKEN", "HARU_RECONCILE_INTERVAL_MS"}
SLOW_S = 1.5

pytestmark = pytest.mark.integration


class SlowEngine(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["content-length"]))
        time.sleep(SLOW_S)
        body = b'{"engine": "slow"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def slow_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(params=[1, 2], ids=["one-worker", "two-workers"])
def served(request, tmp_path, slow_engine):
    env = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    env.update(
        HARU_VAR_DIR=str(tmp_path / "var"),
        HARU_DEFAULT_FLEET="drain",
        HARU_DRAIN_READY_MS="2500",
        HARU_DRAIN_BUDGET_MS="1500",
        HARU_CHAT_HOLD_MS="30000",
        PYTHONUNBUFFERED="1",
    )
    dead = f"http://127.0.0.1:{free_port()}"
    layout = {
        "slug": "drain",
        "activeDomainSlug": "main",
        "domains": [
            {
                "slug": "main",
                "provider": "static",
                "servingBaseUrl": slow_engine,
                "slots": [
                    {
                        "kind": "inference",
                        "gpuIndex": 0,
                        "models": [
                            {"name": "slow", "servingUrl": slow_engine},
                            {"name": "dead", "servingUrl": dead},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [*manage, "seed_layout", "--config", str(path)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [*manage, "serve", "--port", str(port), "--no-reconcile-loop"]
        + ["--workers", str(request.param)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=1, trust_env=False).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.1)
    yield proc, url
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    log.close()


def chat(url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
        trust_env=False,
    )


def test_sigterm_turns_readiness_off_finishes_in_flight_and_answers_held(served):
    proc, url = served
    with ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(chat, url, "slow")
        held = pool.submit(chat, url, "dead")
        time.sleep(0.5)  # both arrived: one at the slow engine, one held
        os.kill(proc.pid, signal.SIGTERM)
        # With --workers, uvicorn's supervisor passes the signal on within half a second.
        deadline = time.monotonic() + 1.5
        while httpx.get(f"{url}/readyz", timeout=2, trust_env=False).status_code != 503:
            assert time.monotonic() < deadline, "/readyz never turned 503"
            time.sleep(0.05)
        assert httpx.get(f"{url}/healthz", timeout=2, trust_env=False).status_code == 200
        done = in_flight.result(timeout=20)
        assert done.status_code == 200
        assert done.json() == {"engine": "slow"}
        answer = held.result(timeout=20)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["code"] == "server_draining"
    with pytest.raises(httpx.TransportError):  # the listener is closed
        httpx.get(f"{url}/healthz", timeout=2, trust_env=False)
    assert proc.wait(20) is not None
