"""What driving the original TypeScript control plane against our supervisor found (issue 28).

Each body here is one the original sends or accepts (its schemas in tests/wire/original say so);
our supervisor must take it as the original supervisor does. Request bodies are checked against
our own wire schemas (`common/wire/schemas/*.request.json`), with the wire's one integer rule:
a number with no fractional part is an integer, and is read as one.
"""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from common.wire import contract
from tests.supervisor.fakes import FakeServerState
from tests.supervisor.test_supervisor_wire_compat import CONFIG, MODELS, refusals


@pytest.fixture
def setup(api):
    servers = {p: FakeServerState(n) for p, n in zip((18001, 18002, 18003), MODELS, strict=True)}
    under_test = api(CONFIG, servers=servers)
    with TestClient(under_test.app) as client:
        yield client, under_test


def refused(response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    return error["message"]


@pytest.mark.parametrize("prompt", [" ", "\n\t  "])
def test_a_whitespace_prompt_the_originals_policy_allows_is_probed(setup, prompt):
    client, under_test = setup
    body = {"prompt": prompt, "maxTokens": 4, "timeoutMs": 4500}
    assert refusals("probe.request", body) == []
    assert contract.problems("probe.request", body) == []  # our own schema agrees
    answer = client.post("/v1/probe?model=big", json=body)
    assert answer.status_code == 200 and answer.json()["ok"] is True
    sent = under_test.servers.servers[18003].chat_bodies[-1]
    assert sent["messages"][0]["content"] == prompt  # forwarded as given


def test_an_empty_prompt_is_still_refused_naming_the_field(setup):
    client, _ = setup
    assert refused(client.post("/v1/probe", json={"prompt": ""})) == "prompt: must not be empty"


def test_whole_number_floats_are_integers_and_reach_the_host_as_ints(setup):
    client, under_test = setup
    # As JavaScript may send 4 and as JSON Schema's `integer` takes it.
    body = b'{"prompt": "ping", "maxTokens": 4.0, "timeoutMs": 3000.0, "seed": 0.0}'
    assert refusals("probe.request", {"maxTokens": 4.0, "timeoutMs": 3000.0}) == []
    answer = client.post("/v1/probe?model=big", content=body)
    assert answer.status_code == 200, answer.text
    sent = under_test.servers.servers[18003].chat_bodies[-1]
    assert sent["max_tokens"] == 4 and type(sent["max_tokens"]) is int
    assert sent["seed"] == 0 and type(sent["seed"]) is int
    slept = client.post("/v1/vllm/sleep", content=b'{"gpuIndex": 1.0}')
    assert [m["name"] for m in slept.json()["models"]] == ["big"]
    assert client.post("/v1/training/stop", content=b'{"graceMs": 1000.0}').status_code == 202


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/vllm/sleep", {"gpuIndex": None}, "gpuIndex: must be an integer, got null"),
        ("/v1/vllm/wake", {"gpuIndex": None}, "gpuIndex: must be an integer, got null"),
        ("/v1/training/stop", {"graceMs": None}, "graceMs: must be an integer, got null"),
        ("/v1/vllm/sleep", {"gpuIndex": 0.5}, "gpuIndex: must be an integer, got a number"),
        ("/v1/vllm/sleep", {"gpuIndex": True}, "gpuIndex: must be an integer, got a boolean"),
        ("/v1/vllm/sleep", {"gpuIndex": -1}, "gpuIndex: must be at least 0"),
        ("/v1/vllm/sleep", {"gpu": 0}, "gpu: is not a known field"),
        ("/v1/training/start", {"now": True}, "now: is not a known field"),
        ("/v1/probe", {"maxTokens": 257}, "maxTokens: must be at most 256"),
        ("/v1/probe", {"prompt": "x" * 8193}, "prompt: must be at most 8192 characters"),
        ("/v1/probe", {"models": ["a", ""]}, "models[1]: must not be empty"),
        ("/v1/probe", {"adapters": {"": ["x"]}}, "adapters: model names must not be empty"),
        ("/v1/probe", {"adapters": {"m": "x"}}, 'adapters: value of "m" must be of type array'),
    ],
)
def test_bodies_the_schemas_refuse_are_400s_naming_the_field(setup, path, body, message):
    client, _ = setup
    assert refused(client.post(path, json=body)) == message


def test_every_problem_of_a_body_is_named_in_one_message(setup):
    client, _ = setup
    message = refused(client.post("/v1/probe", json={"maxTokens": "4", "extra": 1}))
    assert set(message.split("; ")) == {
        "extra: is not a known field",
        "maxTokens: must be an integer, got a string",
    }


def test_a_repeated_key_is_refused_where_the_original_keeps_the_last(setup):
    # Deliberate (docs/wire.md): which of two values a sender meant is not ours to guess.
    client, _ = setup
    message = refused(client.post("/v1/vllm/sleep", content=b'{"gpuIndex": 0, "gpuIndex": 1}'))
    assert "duplicate key 'gpuIndex'" in message


@pytest.mark.parametrize("prompt", ["\ud800", "a\udfffb", "ok \U0001f600"])
def test_a_prompt_with_a_lone_surrogate_is_probed_not_a_500(setup, prompt):
    client, under_test = setup
    # JSON text may escape a lone surrogate; the original's JSON.stringify writes one so.
    body = json.dumps({"prompt": prompt}).encode()
    answer = client.post("/v1/probe?model=big", content=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["ok"] is True
    # The engine gets the prompt exactly as the caller wrote it, escapes and all.
    assert under_test.servers.servers[18003].chat_bodies[-1]["messages"][0]["content"] == prompt


def test_an_engine_answer_with_a_lone_surrogate_still_renders(api):
    servers = {p: FakeServerState(n) for p, n in zip((18001, 18002, 18003), MODELS, strict=True)}
    servers[18003].reply = "half \ud83d"
    under_test = api(CONFIG, servers=servers)
    with TestClient(under_test.app) as client:
        answer = client.post("/v1/probe?model=big", json={"seed": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["answer"] == "half \ud83d"
