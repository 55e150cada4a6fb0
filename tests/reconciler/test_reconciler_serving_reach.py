"""Direct model-server checks and how a supervisor call ended, in model-health terms."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from common.ports import free_port
from fleets.core.model_health import Reach
from fleets.reconciler.supervisor import transport
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.transport import call_reach, serving_reach


@pytest.fixture
def answering():
    """Route every call through a scripted transport; return a setter for its behaviour."""
    behaviour = {}

    def handle(request: httpx.Request) -> httpx.Response:
        behaviour["seen"] = request
        outcome = behaviour["outcome"]
        if isinstance(outcome, Exception):
            raise outcome
        return httpx.Response(outcome)

    previous = transport.use_transport(httpx.MockTransport(handle))
    yield behaviour
    transport.use_transport(previous)


@pytest.mark.parametrize(
    ("outcome", "reach"),
    [
        (200, Reach.ANSWERED),
        (404, Reach.ANSWERED),  # a live server without /health is still a live server
        (401, Reach.ANSWERED),
        (500, Reach.UNAVAILABLE),
        (503, Reach.UNAVAILABLE),
        ("refused", Reach.REFUSED),
        ("timeout", Reach.TIMEOUT),
        ("reset", Reach.UNAVAILABLE),
    ],
)
def test_serving_reach_classifies_every_ending(answering, outcome, reach):
    request = httpx.Request("GET", "http://m:1/health")
    answering["outcome"] = {
        "refused": httpx.ConnectError("refused", request=request),
        "timeout": httpx.ConnectTimeout("slow", request=request),
        "reset": httpx.RemoteProtocolError("reset", request=request),
    }.get(outcome, outcome)
    assert serving_reach("http://10.0.0.9:8000/", timeout=0.5) == reach
    seen = answering["seen"]
    assert str(seen.url) == "http://10.0.0.9:8000/health"
    assert "authorization" not in seen.headers  # no credentials go to a model server


def test_a_supervisor_call_carries_whether_it_was_refused(answering):
    request = httpx.Request("GET", "https://s:1/v1/status")
    sup = SupervisorClient("https://s:1", token="t")
    answering["outcome"] = httpx.ConnectError("refused", request=request)
    refused = sup.status(timeout=0.5)
    assert refused.error.refused and call_reach(refused) == Reach.REFUSED
    answering["outcome"] = httpx.ReadTimeout("slow", request=request)
    slow = sup.status(timeout=0.5)
    assert not slow.error.refused and call_reach(slow) == Reach.TIMEOUT
    answering["outcome"] = 502
    assert call_reach(sup.status(timeout=0.5)) == Reach.UNAVAILABLE


def test_against_real_sockets_a_closed_port_refuses_and_a_live_server_answers():
    closed = free_port()
    assert serving_reach(f"http://127.0.0.1:{closed}", timeout=1.0) == Reach.REFUSED

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert serving_reach(f"http://127.0.0.1:{server.server_port}", timeout=1.0) == (
            Reach.ANSWERED
        )
    finally:
        server.shutdown()
        server.server_close()
