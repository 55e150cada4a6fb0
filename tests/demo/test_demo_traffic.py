"""`haru.demo traffic`: asks for the adapter the demo's trainer publishes and says, each second,
which version answered (or what failed)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from haru import demo


class FakeClient:
    """The HTTP transport: answers from a script, recording what was asked."""

    def __init__(self, answers):
        self.answers = iter(answers)
        self.bodies: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def post(self, url, json, headers):
        self.bodies.append(json)
        answer = next(self.answers)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_traffic_counts_each_version_and_each_failure(monkeypatch, capsys):
    ok = {"x-haru-adapter-version": "support-bot@v2"}
    answers = [
        httpx.Response(200, headers=ok, json={}),
        httpx.Response(200, headers={"x-haru-adapter-version": "support-bot@v3"}, json={}),
        httpx.Response(200, headers=ok, json={}),
        httpx.Response(503, json={"error": {"message": "adapter support-bot is not ready"}}),
        httpx.ConnectError("refused"),
    ] + [httpx.Response(200, headers=ok, json={})] * 500
    client = FakeClient(answers)
    monkeypatch.setattr(demo.httpx, "Client", lambda **kw: client)
    clock = iter(i * 0.01 for i in range(10_000))
    monkeypatch.setattr(demo.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)

    assert demo.traffic(rate=100, seconds=0.5) == 0

    line = capsys.readouterr().out.splitlines()[0]
    assert "support-bot@v3 x1" in line
    assert "HTTP 503 adapter support-bot is not ready x1" in line
    assert "ConnectError x1" in line
    assert all(b["model"] == "support-bot" for b in client.bodies)


@pytest.mark.parametrize("rate", ["0", "-1", "51"])
def test_traffic_refuses_a_rate_out_of_bounds(rate):
    with pytest.raises(SystemExit) as exc:
        demo.main(["traffic", "--rate", rate])
    assert exc.value.code == 2


def test_the_demos_own_users_ask_for_the_adapter_quietly_until_stopped(monkeypatch, capsys):
    """`make demo` sends its own requests for the adapter (a canary's gates need samples),
    printing nothing, and stops when the demo does."""
    ok = httpx.Response(200, headers={"x-haru-adapter-version": "support-bot@v1"}, json={})
    client = FakeClient([httpx.ConnectError("not up yet")] + [ok] * 10_000)
    monkeypatch.setattr(demo.httpx, "Client", lambda **kw: client)
    stop = threading.Event()
    thread = demo.background_users(stop, rate=500)
    deadline = time.monotonic() + 10
    while len(client.bodies) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(client.bodies) >= 5  # a refused connection does not end it
    assert all(b["model"] == "support-bot" for b in client.bodies)
    assert capsys.readouterr().out == ""
