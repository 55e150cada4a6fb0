"""What the supervisor client sends to a URL stored with credentials, and how it words an answer
it does not follow (issue 29: Basic auth in place of the bearer token; "HTTP 302 HTTP 302")."""

from __future__ import annotations

import httpx
import pytest

from fleets.reconciler.supervisor import transport
from fleets.reconciler.supervisor.transport import HTTP, Door, serving_reach

TOKEN = "supervisor-token-for-tests-0123456789ab"
SECRET = "hunter2-secret"


@pytest.fixture
def supervisor():
    """A scripted supervisor: records each request, answers with `answer` (status, headers,
    body)."""
    script: dict = {"seen": [], "answer": (200, {}, b"{}")}

    def handle(request: httpx.Request) -> httpx.Response:
        script["seen"].append(request)
        status, headers, body = script["answer"]
        return httpx.Response(status, headers=headers, content=body)

    previous = transport.use_transport(httpx.MockTransport(handle))
    yield script
    transport.use_transport(previous)


def _status(door: Door) -> transport.Call:
    return door.send("GET", "/v1/status", 2.0, lambda payload: payload)


def test_a_legacy_url_with_credentials_gets_the_bearer_token_and_never_the_password(supervisor):
    door = Door(f"https://ops:{SECRET}@10.0.0.1:8701", token=TOKEN)
    assert _status(door).ok
    (request,) = supervisor["seen"]
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert str(request.url) == "https://10.0.0.1:8701/v1/status"
    assert SECRET not in str(request.url) and SECRET not in str(request.headers)


def test_a_model_server_url_with_credentials_is_checked_without_them(supervisor):
    serving_reach(f"http://u:{SECRET}@10.0.0.9:8000/", timeout=0.5)
    (request,) = supervisor["seen"]
    assert str(request.url) == "http://10.0.0.9:8000/health"
    assert "authorization" not in request.headers


def test_a_redirect_is_reported_once_with_where_it_points_and_not_followed(supervisor):
    supervisor["answer"] = (
        302,
        {"location": f"https://u:{SECRET}@elsewhere.example:8443/login?key=k-991#frag"},
        b"",
    )
    call = _status(Door("https://10.0.0.1:8701", token=TOKEN))
    assert call.error is not None and call.error.kind == HTTP and call.error.status == 302
    assert call.error.message == (
        "GET https://10.0.0.1:8701/v1/status: HTTP 302, redirect to "
        "https://elsewhere.example:8443/login not followed"
    )
    assert len(supervisor["seen"]) == 1  # not followed


def test_an_error_without_the_supervisor_s_envelope_names_its_status_once(supervisor):
    supervisor["answer"] = (502, {}, b"bad gateway")
    call = _status(Door("https://10.0.0.1:8701", token=TOKEN))
    assert call.error is not None
    assert call.error.message == "GET https://10.0.0.1:8701/v1/status: HTTP 502"
    supervisor["answer"] = (500, {}, b'{"error": {"code": "internal", "message": "boom"}}')
    call = _status(Door("https://10.0.0.1:8701", token=TOKEN))
    assert call.error is not None
    assert call.error.message == "GET https://10.0.0.1:8701/v1/status: HTTP 500 internal: boom"
