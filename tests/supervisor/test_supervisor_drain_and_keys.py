"""Drain before sleep, joined sleeps, and model-server API keys by reference."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from starlette.testclient import TestClient

from common.strict_json import ConfigError
from common.wire.contract import check_response
from supervisor.engines.control import drain_deadline
from tests.supervisor.fakes import FakeServerState

SECRET = "sk-model-server-key-0123456789"


def config(drain_ms: int, **model: object) -> dict:
    return {
        "drainBudgetMs": drain_ms,
        "slots": [
            {"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 18001, **model}]}
        ],
    }


def checked(app) -> TestClient:
    client = TestClient(app)
    client.event_hooks = {"request": [], "response": [check_response]}
    return client


def test_sleep_waits_until_nothing_runs_then_sleeps(api):
    server = FakeServerState("m", running=[2, 1, 0])
    under_test = api(config(5000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep")
    assert answer.status_code == 200
    assert server.calls.count("GET /metrics") == 3
    assert server.calls[-1] == "POST /sleep" and server.sleep_queries == ["level=1"]
    assert answer.json()["models"][0]["drainedMs"] >= 0


def test_a_drain_past_its_budget_sleeps_anyway_and_vllm_aborts_the_rest(api):
    server = FakeServerState("m", running=[3])
    under_test = api(config(300), servers={18001: server})
    with checked(under_test.app) as client:
        assert client.post("/v1/vllm/sleep").status_code == 200
    assert server.sleeping is True and server.calls.count("GET /metrics") >= 2


def test_without_metrics_the_sleep_asks_vllm_to_wait_for_running_requests(api):
    server = FakeServerState("m")
    under_test = api(config(5000), servers={18001: server})
    with checked(under_test.app) as client:
        assert client.post("/v1/vllm/sleep").status_code == 200
    assert server.sleep_queries == ["level=1&mode=wait"]


def test_a_zero_budget_sleeps_at_once(api):
    server = FakeServerState("m", running=[5])
    under_test = api(config(0), servers={18001: server})
    with checked(under_test.app) as client:
        assert client.post("/v1/vllm/sleep").status_code == 200
    assert "GET /metrics" not in server.calls and server.sleep_queries == ["level=1"]


def test_a_bounded_sleep_answers_draining_and_the_next_call_joins_it(api):
    server = FakeServerState("m", running=[1] * 12 + [0])
    under_test = api(config(10_000), servers={18001: server})
    with checked(under_test.app) as client:
        first = client.post("/v1/vllm/sleep?waitMs=100")
        assert first.status_code == 202 and first.json()["status"] == "draining"
        status = client.get("/v1/status").json()
        assert status["slots"][0]["models"][0]["draining"] is True
        assert "sleep.drain" in status["features"]
        second = client.post("/v1/vllm/sleep")  # joins: no second drain, no second sleep
        assert second.status_code == 200
    assert server.sleep_queries == ["level=1"]


def test_a_stated_budget_ends_the_drain_in_time_for_the_sleep(api):
    # A long request on the old active and a 30 s drain budget: a caller that waits 2 s for
    # the sleep (budgetMs) gets it asleep within them; 1 s of it is kept for the sleep itself.
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        started = time.monotonic()
        answer = client.post("/v1/vllm/sleep?budgetMs=2000")
        took = time.monotonic() - started
    assert answer.status_code == 200 and server.sleep_queries == ["level=1"]
    assert 0.9 <= answer.json()["models"][0]["drainedMs"] / 1000 <= 1.7
    assert took < 2.0


def test_a_caller_joining_a_drain_brings_its_end_forward_never_back(api):
    server = FakeServerState("m", running=[1])
    under_test = api(config(30_000), servers={18001: server})
    with checked(under_test.app) as client:
        first = client.post("/v1/vllm/sleep?waitMs=100")  # our control plane, no budget yet
        assert first.status_code == 202
        started = time.monotonic()
        joined = client.post("/v1/vllm/sleep?budgetMs=1500")
        assert joined.status_code == 200 and time.monotonic() - started < 1.5
        # A later, longer budget cannot stretch the next sleep's drain past a shorter one.
        client.post("/v1/vllm/wake")
        again = client.post("/v1/vllm/sleep?waitMs=100&budgetMs=1200")
        assert again.status_code == 202
        longer = client.post("/v1/vllm/sleep?budgetMs=60000")
        assert longer.status_code == 200
        assert longer.json()["models"][0]["drainedMs"] < 1500
    assert server.sleep_queries == ["level=1", "level=1"]


def test_the_drain_deadline_keeps_a_share_of_the_budget_for_the_sleep():
    assert drain_deadline(100.0, 2.0) == 101.0  # at least 1 s kept
    assert drain_deadline(100.0, 20.0) == 115.0  # a quarter
    assert drain_deadline(100.0, 80.0) == 170.0  # at most 10 s
    assert drain_deadline(100.0, 0.5) == 100.0  # no time to drain: sleep at once


@pytest.mark.parametrize("query", ["budgetMs=soon", "budgetMs=0", "budgetMs=-5"])
def test_a_bad_budget_is_refused(api, query):
    under_test = api(config(0), servers={18001: FakeServerState("m")})
    with checked(under_test.app) as client:
        answer = client.post(f"/v1/vllm/sleep?{query}")
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "budgetMs must be a positive integer"


def test_concurrent_sleeps_send_one_sleep_to_the_server(api):
    server = FakeServerState("m", running=[1] * 5 + [0])
    under_test = api(config(10_000), servers={18001: server})
    with checked(under_test.app) as client:
        codes: list[int] = []
        calls = [
            threading.Thread(target=lambda: codes.append(client.post("/v1/vllm/sleep").status_code))
            for _ in range(3)
        ]
        for t in calls:
            t.start()
        for t in calls:
            t.join(10)
    assert codes == [200, 200, 200]
    assert server.sleep_queries == ["level=1"]


def test_bad_wait_ms_is_refused(api):
    under_test = api(config(0), servers={18001: FakeServerState("m")})
    with checked(under_test.app) as client:
        assert client.post("/v1/vllm/sleep?waitMs=soon").status_code == 400


def test_the_probe_passes_against_a_server_that_needs_its_api_key(api, tmp_path, caplog):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    server = FakeServerState("m", api_key=SECRET)
    under_test = api(config(0, apiKey={"file": str(key_file)}), servers={18001: server})
    caplog.set_level(logging.DEBUG)
    with checked(under_test.app) as client:
        probe = client.post("/v1/probe", json={})
        status = client.get("/v1/status")
    assert probe.json()["ok"] is True
    for text in (probe.text, status.text, caplog.text):
        assert SECRET not in text


def test_a_missing_key_fails_the_probe_naming_only_the_reference(api, tmp_path):
    server = FakeServerState("m", api_key=SECRET)
    missing = tmp_path / "nope"
    under_test = api(config(0, apiKey={"file": str(missing)}), servers={18001: server})
    with checked(under_test.app) as client:
        (result,) = client.post("/v1/probe", json={}).json()["results"]
    assert result["ok"] is False and str(missing) in result["error"]


def test_without_the_key_the_server_refuses_the_probe(api):
    server = FakeServerState("m", api_key=SECRET)
    under_test = api(config(0), servers={18001: server})
    with checked(under_test.app) as client:
        (result,) = client.post("/v1/probe", json={}).json()["results"]
    assert result["ok"] is False and result["error"].startswith("HTTP 401")


def test_an_api_key_must_be_a_reference_and_a_refusal_never_quotes_it(api):
    for bad in ({"value": SECRET}, {"env": "A", "file": "/x"}, {"env": "not a name"}, SECRET):
        with pytest.raises(ConfigError) as caught:
            api(config(0, apiKey=bad), servers={})
        assert "apiKey" in caught.value.render()
        assert SECRET not in caught.value.render()


def test_a_bounded_sleep_that_finishes_in_time_is_a_200_with_one_sleep_sent(api):
    server = FakeServerState("m", running=[1, 0])
    under_test = api(config(10_000), servers={18001: server})
    with checked(under_test.app) as client:
        answer = client.post("/v1/vllm/sleep?waitMs=5000")
    assert answer.status_code == 200 and answer.json()["status"] == "ok"
    assert server.sleep_queries == ["level=1"]
