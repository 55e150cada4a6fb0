"""A drain bound the caller gives (`?drainMs=`, feature drain-bound): past it the sleep aborts
what still runs, so a planned promotion moves long streams instead of waiting for them."""

from __future__ import annotations

import pytest

from tests.supervisor.fakes import FakeServerState
from tests.supervisor.test_supervisor_drain_and_keys import checked, config


def test_a_drain_bound_ends_the_drain_and_the_sleep_aborts_what_still_runs(api):
    # A stream that would run for minutes and a 30 s drain budget: the caller's 300 ms bound
    # ends the drain, and the plain sleep (not mode=wait) makes the engine abort the stream.
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep?drainMs=300")
    assert answer.status_code == 200
    assert server.sleeping is True and server.sleep_queries == ["level=1"]
    drained_ms = answer.json()["models"][0]["drainedMs"]
    assert 300 <= drained_ms < 30_000  # the sleep came after the bound, not after the budget
    assert server.calls.count("GET /metrics") >= 2  # it did drain until then


def test_a_drain_bound_of_zero_sleeps_at_once_and_aborts_what_runs(api):
    # What a planned promotion sends to move every stream at the switch: no drain at all.
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep?drainMs=0")
    assert answer.status_code == 200
    assert server.sleeping is True and server.sleep_queries == ["level=1"]
    assert answer.json()["models"][0]["drainedMs"] < 1_000


def test_a_drain_that_empties_before_its_bound_sleeps_then(api):
    server = FakeServerState("m", running=[1, 0])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep?drainMs=60000")
    assert answer.status_code == 200 and server.sleep_queries == ["level=1"]
    assert server.calls.count("GET /metrics") == 2


def test_the_earlier_of_a_budget_and_a_drain_bound_ends_the_drain(api):
    # budgetMs=20000 alone would drain for 15 s (a quarter kept for the sleep).
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep?budgetMs=20000&drainMs=200")
    assert answer.status_code == 200
    assert 200 <= answer.json()["models"][0]["drainedMs"] < 15_000


def test_a_bounded_drain_in_flight_shows_as_draining_and_a_later_call_joins_it(api):
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        first = client.post("/v1/vllm/sleep?waitMs=50&drainMs=400")
        assert first.status_code == 202 and first.json()["status"] == "draining"
        joined = client.post("/v1/vllm/sleep")  # no bound of its own: the first one holds
        assert joined.status_code == 200
        assert joined.json()["models"][0]["drainedMs"] < 30_000
    assert server.sleep_queries == ["level=1"]


def test_the_supervisor_lists_the_drain_bound_among_its_features(api):
    under_test = api(config(0), servers={18001: FakeServerState("m")})
    with checked(under_test.app) as client:
        assert "drain-bound" in client.get("/v1/status").json()["features"]


@pytest.mark.parametrize("value", ["soon", "-5", "1.5", "", "2147483648"])
def test_a_bad_drain_bound_is_refused_and_nothing_sleeps(api, value):
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post(f"/v1/vllm/sleep?drainMs={value}")
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "code": "invalid_request",
        "message": "drainMs must be a non-negative integer",
    }
    assert server.sleeping is False and server.calls == []
