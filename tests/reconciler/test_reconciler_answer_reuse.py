"""A supervisor answer sent again byte for byte is not read again; the contract still holds on
every body that differs (`fleets/reconciler/supervisor/answers.py`)."""

from __future__ import annotations

import json

import httpx
import pytest

from fleets.reconciler.supervisor import answers
from fleets.reconciler.supervisor.client import SupervisorClient

TOKEN = "Kq7vR2mXw9LpT4sZb8NdYc3HfJ6uGa5E"

GOOD = json.dumps(
    {
        "slots": [
            {
                "gpuIndex": 0,
                "kind": "inference",
                "models": [{"name": "a", "port": 8001, "sleeping": False}],
            }
        ],
        "ready": True,
    }
).encode()
# The same answer with one field off the contract (a port below 1 is no port).
BAD = GOOD.replace(b'"port": 8001', b'"port": -3')


@pytest.fixture(autouse=True)
def _fresh_answers():
    answers.forget()
    yield
    answers.forget()


def answering(bodies: list[bytes], url: str = "https://sup.example:8701") -> SupervisorClient:
    """A client whose supervisor answers `bodies` in turn."""
    queue = list(bodies)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=queue.pop(0))

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return SupervisorClient(url, token=TOKEN, http=http, on_error=None)


def test_the_same_status_body_again_is_answered_with_the_value_read_before():
    client = answering([GOOD, GOOD])
    first = client.status(timeout=1)
    second = client.status(timeout=1)
    assert first.ok and second.ok
    assert second.value is first.value  # not parsed, checked and read a second time
    assert second.value.model("a").sleeping is False


def test_a_body_that_changes_is_checked_again_and_refused_when_off_the_contract():
    client = answering([GOOD, BAD, BAD, GOOD])
    good = client.status(timeout=1)
    refused = client.status(timeout=1)
    again = client.status(timeout=1)
    back = client.status(timeout=1)
    assert good.ok
    # A refused body is never remembered: it is refused every time it comes.
    for call in (refused, again):
        assert call.error is not None and call.error.kind == "bad_body"
        assert "port" in call.error.message
    # The good body after the bad one is read afresh (the bad one replaced nothing kept).
    assert back.ok and back.value.model("a").sleeping is False


def test_answers_are_kept_per_supervisor():
    one = answering([GOOD, GOOD], "https://one.example:8701")
    two = answering([GOOD], "https://two.example:8701")
    first = one.status(timeout=1)
    other = two.status(timeout=1)
    assert other.value is not first.value
    assert one.status(timeout=1).value is first.value


def test_the_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(answers, "MAX_ENTRIES", 2)
    clients = [answering([GOOD, GOOD], f"https://h{i}.example:8701") for i in range(3)]
    firsts = [c.status(timeout=1).value for c in clients]
    # The oldest entry went when the third came: its next answer is read afresh.
    assert clients[0].status(timeout=1).value is not firsts[0]
    assert clients[2].status(timeout=1).value is firsts[2]


def test_answers_of_mutable_shape_are_never_shared():
    # POST answers are plain dictionaries the caller may keep: each call reads its own.
    body = b'{"status": "ok"}'
    http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body)))
    client = SupervisorClient("https://sup.example:8701", token=TOKEN, http=http, on_error=None)
    first = client.wake(timeout=1)
    second = client.wake(timeout=1)
    assert first.ok and second.ok
    assert first.value == second.value and first.value is not second.value
