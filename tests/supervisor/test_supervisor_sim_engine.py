"""The simulated engine as a real process: OpenAI API, sleep endpoints, faults, cancellation."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time

import httpx
import pytest

from supervisor.gpu.sim_state import SimGpuState

pytestmark = pytest.mark.integration

WEIGHTS, CONTEXT = 3000, 200


@pytest.fixture(scope="module")
def state_file(tmp_path_factory):
    return tmp_path_factory.mktemp("sim") / "gpu.json"


@pytest.fixture(scope="module")
def fast(module_processes, tools, state_file):
    """An echoing engine with no delays, holding simulated memory on GPU 0."""
    return tools.start_sim(
        module_processes,
        "qwen-small",
        "--echo",
        "--weights-mib",
        str(WEIGHTS),
        "--context-mib",
        str(CONTEXT),
        "--sim-state",
        str(state_file),
    )


@pytest.fixture(scope="module")
def slow(module_processes, tools):
    """An engine that produces tokens slowly, for cancellation tests."""
    return tools.start_sim(module_processes, "llama-small", "--token-delay-ms", "50")


@pytest.fixture
def client(fast):
    with httpx.Client(base_url=fast.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        c.post("/wake_up")
        yield c


def chat(model: str = "qwen-small", text: str = "hello there", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def sse_events(body: str) -> list:
    events = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_models_and_health(client):
    assert client.get("/health").status_code == 200
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["qwen-small"]


def test_non_streaming_chat_echoes_and_proves_the_request_bytes(client):
    raw = json.dumps(chat(text="ping from the test", max_tokens=3)).encode()
    body = client.post("/v1/chat/completions", content=raw).json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "qwen-small"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ping from the"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert body["haru_sim"] == {
        "requestSha256": hashlib.sha256(raw).hexdigest(),
        "requestBytes": len(raw),
    }


def test_streaming_chat_sends_sse_chunks_then_done(client):
    response = client.post(
        "/v1/chat/completions",
        json=chat(text="one two three", stream=True, stream_options={"include_usage": True}),
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_completions_streaming_and_not(client):
    whole = client.post(
        "/v1/completions", json={"model": "qwen-small", "prompt": "a b", "max_tokens": 5}
    ).json()
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "a b"
    streamed = client.post(
        "/v1/completions", json={"model": "qwen-small", "prompt": "a b", "stream": True}
    )
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "a b"


def test_wrong_model_and_bad_json_are_refused(client):
    missing = client.post("/v1/chat/completions", json=chat(model="gpt-4"))
    assert missing.status_code == 404
    assert "gpt-4" in missing.json()["error"]["message"]
    assert client.post("/v1/chat/completions", content=b"{oops").status_code == 400


def test_last_request_returns_the_exact_bytes(client):
    raw = b'{"model":"qwen-small",  "messages":[{"role":"user","content":"caf\xc3\xa9 \\u00e9"}]}'
    client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert client.get("/_sim/last-request?raw=1").content == raw
    described = client.get("/_sim/last-request").json()
    assert base64.b64decode(described["bodyBase64"]) == raw
    assert described["path"] == "/v1/chat/completions" and described["method"] == "POST"
    assert ["content-type", "application/json"] in described["headers"]


def test_sleep_frees_the_weights_and_holds_inference_until_wake(client, fast, state_file):
    state = SimGpuState(state_file)
    assert state.used_mib(0) == WEIGHTS + CONTEXT
    assert client.post("/sleep?level=1").status_code == 200
    assert client.post("/sleep?level=1").status_code == 200  # idempotent
    assert client.get("/is_sleeping").json() == {"is_sleeping": True}
    assert state.used_mib(0) == CONTEXT
    held: dict[str, int] = {}

    def ask() -> None:
        held["status"] = httpx.post(
            f"{fast.url}/v1/chat/completions", json=chat(), timeout=10
        ).status_code

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.3)
    assert "status" not in held  # held, as vLLM holds it, not refused
    assert client.post("/wake_up").status_code == 200
    asker.join(5)
    assert held["status"] == 200
    assert client.get("/is_sleeping").json() == {"is_sleeping": False}
    assert state.used_mib(0) == WEIGHTS + CONTEXT
    stats = client.get("/_sim/stats").json()
    assert (stats["sleeps"], stats["wakes"]) == (1, 1)


def test_sleep_level_three_is_refused_in_vllms_envelope(client):
    refused = client.post("/sleep?level=3")
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "query.level"


def test_faults_can_be_injected_at_runtime(client):
    assert client.post("/_sim/faults", json={"inference5xx": True}).json()["inference5xx"] is True
    assert client.post("/v1/chat/completions", json=chat()).status_code == 500
    client.post("/_sim/faults", json={"inference5xx": False, "isSleepingGarbage": True})
    assert client.get("/is_sleeping").json() == {"is_sleeping": "unknown"}
    client.post("/_sim/faults", json={"isSleepingGarbage": False, "wakeFails": True})
    client.post("/sleep")
    assert client.post("/wake_up").status_code == 500
    assert client.get("/is_sleeping").json()["is_sleeping"] is True
    assert client.post("/_sim/faults", json={"explode": True}).status_code == 400


def test_a_hanging_wake_resumes_when_the_fault_is_cleared(client, fast):
    client.post("/sleep")
    client.post("/_sim/faults", json={"wakeHangs": True})
    result: dict[str, int] = {}

    def wake() -> None:
        result["status"] = httpx.post(f"{fast.url}/wake_up", timeout=10).status_code

    thread = threading.Thread(target=wake)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive(), "wake should hang while the fault is set"
    client.post("/_sim/faults", json={"wakeHangs": False})
    thread.join(5)
    assert result == {"status": 200}


def test_a_client_disconnect_cancels_a_stream(slow, tools):
    with httpx.Client(base_url=slow.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        body = chat(model="llama-small", stream=True, max_tokens=16)
        with c.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
        # Leaving the block closed the connection mid-stream.
        tools.wait_for(lambda: c.get("/_sim/stats").json()["cancelled"] == 1, timeout=5)
        stats = c.get("/_sim/stats").json()
        assert stats["completed"] == 0 and stats["inflight"] == 0


def test_a_client_disconnect_cancels_a_slow_non_streaming_request(slow, tools):
    with httpx.Client(base_url=slow.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{slow.url}/v1/chat/completions", json=chat(model="llama-small"), timeout=0.2
            )
        tools.wait_for(lambda: c.get("/_sim/stats").json()["cancelled"] == 1, timeout=5)


def test_a_finished_stream_is_not_counted_as_cancelled(slow):
    with httpx.Client(base_url=slow.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        c.post("/v1/chat/completions", json=chat(model="llama-small", stream=True, max_tokens=2))
        stats = c.get("/_sim/stats").json()
        assert (stats["completed"], stats["cancelled"]) == (1, 0)


def test_metrics_are_prometheus_text(client):
    client.post("/v1/chat/completions", json=chat())
    text = client.get("/metrics").text
    assert 'haru_sim_requests_total{model_name="qwen-small"} 1' in text
    assert 'vllm:num_requests_running{model_name="qwen-small"} 0' in text


def test_default_reply_is_deterministic(slow):
    body = httpx.post(
        f"{slow.url}/v1/chat/completions", json=chat(model="llama-small", max_tokens=4), timeout=5
    ).json()
    assert body["choices"][0]["message"]["content"] == "Hello from llama-small, a"


def test_non_streaming_completion_is_cheap(client):
    payload = json.dumps(chat(max_tokens=4)).encode()
    started = time.monotonic()
    for _ in range(100):
        assert client.post("/v1/chat/completions", content=payload).status_code == 200
    assert time.monotonic() - started < 5.0


def test_crash_fault_kills_the_process_and_its_memory_goes_with_it(processes, tools, tmp_path):
    state = SimGpuState(tmp_path / "gpu.json")
    sim = tools.start_sim(
        processes, "doomed", "--weights-mib", "1000", "--sim-state", str(tmp_path / "gpu.json")
    )
    assert state.used_mib(0) == 1000
    httpx.post(f"{sim.url}/_sim/faults", json={"crash": True}, timeout=5)
    assert sim.proc.wait(timeout=5) == 70
    assert state.used_mib(0) == 0


@pytest.fixture(scope="module")
def with_lora(module_processes, tools):
    """An engine serving a LoRA adapter, as vLLM's --lora-modules does."""
    return tools.start_sim(module_processes, "qwen-small", "--lora-modules", "qwen-sql=/dev/null")


def _answer(c: httpx.Client, model: str) -> str:
    body = chat(model, "ping", temperature=0, seed=1337, max_tokens=32)
    response = c.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_sim_answers_the_same_until_a_fault_makes_a_wake_change_it(with_lora):
    with httpx.Client(base_url=with_lora.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        c.post("/wake_up")
        assert c.get("/version").json() == {"version": "sim-1"}
        base, sql = _answer(c, "qwen-small"), _answer(c, "qwen-sql")
        assert sql == f"{base} Adapter qwen-sql applied."
        assert (_answer(c, "qwen-small"), _answer(c, "qwen-sql")) == (base, sql)  # deterministic

        # The faults take effect at the next wake, not before.
        c.post("/_sim/faults", json={"adaptersLostAfterWake": True})
        assert _answer(c, "qwen-sql") == sql
        c.post("/sleep?level=1")
        c.post("/wake_up")
        assert _answer(c, "qwen-sql") == base  # the adapter silently stopped applying
        assert _answer(c, "qwen-small") == base

        c.post("/_sim/faults", json={"answerDriftsAfterWake": True})
        c.post("/sleep?level=1")
        c.post("/wake_up")
        assert _answer(c, "qwen-small") == f"Drifted after wake: {base}"

        c.post("/_sim/reset")
        assert _answer(c, "qwen-sql") == sql
        assert c.post("/v1/chat/completions", json=chat("other", "ping")).status_code == 404


def test_the_wrong_answer_fault_changes_the_answers_at_once_and_a_reset_heals_them(with_lora):
    with httpx.Client(base_url=with_lora.url, timeout=10, trust_env=False) as c:
        c.post("/_sim/reset")
        c.post("/wake_up")
        base = _answer(c, "qwen-small")
        assert c.post("/_sim/faults", json={"answerWrong": True}).json()["answerWrong"] is True
        # No wake in between: a version that goes bad mid-rollout.
        assert _answer(c, "qwen-small") == f"Drifted after wake: {base}"
        c.post("/_sim/reset")
        assert _answer(c, "qwen-small") == base
