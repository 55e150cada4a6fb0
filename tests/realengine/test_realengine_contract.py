"""One contract, two engines: the simulator and a real vLLM must answer alike.

Every test runs against both (`engine` is parametrised), so the simulator cannot drift from
what vLLM does again. What only a GPU shows (memory released on sleep) is out of scope here.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.realengine.conftest import MODEL, Served, free_port, stop, wait_healthy

pytestmark = pytest.mark.realengine

LONG_REPLY = " ".join(f"w{i}" for i in range(400))


@pytest.fixture(scope="module")
def sim_engine(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "supervisor.sim",
                "--port",
                str(port),
                "--model",
                MODEL,
                "--max-model-len",
                "512",
                "--token-delay-ms",
                "30",
                "--reply",
                LONG_REPLY,
            ],  # fmt: skip
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(f"http://127.0.0.1:{port}", port, proc, log)
    wait_healthy(served.url, proc, log, 30)
    yield served
    stop(proc)


@pytest.fixture(params=["sim", "vllm"])
def engine(request):
    served = (
        request.getfixturevalue("sim_engine")
        if request.param == "sim"
        else request.getfixturevalue("engines").plain
    )
    with httpx.Client(base_url=served.url, timeout=120, trust_env=False) as client:
        yield client
        client.post("/wake_up")  # leave it serving for the next test


def chat(max_tokens: int = 4, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        **extra,
    }


def long_chat(max_tokens: int) -> dict:
    # ignore_eos: the random model must not stop early (the simulator ignores the field).
    return chat(max_tokens, ignore_eos=True)


def in_background(client: httpx.Client, body: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        response = httpx.post(
            f"{str(client.base_url).rstrip('/')}/v1/chat/completions",
            json=body,
            timeout=120,
            trust_env=False,
        )
        out["status"] = response.status_code
        out["body"] = response.json()
        out["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def running(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def wait_running(client: httpx.Client, out: dict) -> None:
    deadline = time.monotonic() + 30
    while running(client) < 1:
        assert "status" not in out, "the request finished before it was seen running"
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.05)


def test_health_is_an_empty_200(engine):
    response = engine.get("/health")
    assert response.status_code == 200 and response.content == b""


def test_models_carry_vllms_fields(engine):
    (model,) = engine.get("/v1/models").json()["data"]
    assert model["id"] == MODEL and model["object"] == "model" and model["owned_by"] == "vllm"
    assert model["max_model_len"] == 512
    assert "root" in model and "parent" in model
    assert model["permission"][0]["object"] == "model_permission"


def test_an_unknown_model_is_vllms_own_404(engine):
    response = engine.post("/v1/chat/completions", json={**chat(), "model": "nope"})
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": f"The model `nope` does not exist. Valid aliases: {MODEL}.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_sleep_and_wake_answer_json_and_a_partial_wake_stays_asleep(engine):
    assert engine.get("/is_sleeping").json() == {"is_sleeping": False}
    assert engine.post("/sleep?level=1").json() == {"status": "sleeping", "level": 1}
    assert engine.get("/is_sleeping").json() == {"is_sleeping": True}
    partial = engine.post("/wake_up?tags=weights").json()
    assert partial == {"status": "sleeping", "tags": ["weights"]}
    assert engine.get("/is_sleeping").json() == {"is_sleeping": True}
    assert engine.post("/wake_up").json() == {"status": "awake", "tags": None}
    assert engine.get("/is_sleeping").json() == {"is_sleeping": False}
    assert engine.get("/health").status_code == 200


def test_level_three_is_a_400_and_get_sleep_a_405(engine):
    refused = engine.post("/sleep?level=3")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "query.level", 400)
    assert engine.get("/sleep").status_code == 405
    assert engine.get("/is_sleeping").json() == {"is_sleeping": False}


def test_a_request_while_asleep_is_held_and_served_after_wake(engine):
    engine.post("/sleep?level=1")
    assert engine.get("/v1/models").status_code == 200  # still answers while asleep
    thread, out = in_background(engine, chat())
    time.sleep(1.0)
    assert "status" not in out, "a sleeping engine must hold the request, not answer it"
    woke_at = time.monotonic()
    engine.post("/wake_up")
    thread.join(60)
    assert out["status"] == 200 and out["body"]["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["at"] - woke_at < 30


def test_detokenize_answers_at_once_while_asleep_and_alike_awake(engine):
    # Why a cut stream's text before the seam is read from the standby while it still sleeps
    # (fleets/proxy/continuation.py): the tokenizer lives in the API server, not the weights.
    ids = engine.post("/tokenize", json={"model": MODEL, "prompt": "rivers and lighthouses"})
    tokens = ids.json()["tokens"]
    awake = engine.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    assert engine.post("/sleep?level=1").status_code == 200
    started = time.monotonic()
    asleep = engine.post("/detokenize", json={"model": MODEL, "tokens": tokens}, timeout=10)
    assert time.monotonic() - started < 5
    assert asleep.status_code == 200 and asleep.json() == awake.json()
    assert engine.get("/is_sleeping").json() == {"is_sleeping": True}


def test_sleep_aborts_a_running_request(engine):
    # As long as the context allows (512 less the prompt): on a loaded machine the tiny model
    # must still be running when /metrics is polled.
    thread, out = in_background(engine, long_chat(480))
    wait_running(engine, out)
    assert engine.post("/sleep?level=1").status_code == 200
    thread.join(60)
    assert out["status"] == 200
    assert out["body"]["choices"][0]["finish_reason"] == "abort"
    assert out["body"]["usage"]["completion_tokens"] < 480


def test_sleep_mode_wait_lets_a_running_request_finish(engine):
    thread, out = in_background(engine, long_chat(80))
    wait_running(engine, out)
    assert engine.post("/sleep?level=1&mode=wait").status_code == 200
    thread.join(60)
    assert out["status"] == 200
    assert out["body"]["choices"][0]["finish_reason"] == "length"
    assert out["body"]["usage"]["completion_tokens"] == 80
    assert engine.get("/is_sleeping").json() == {"is_sleeping": True}


def test_load_is_zero_without_load_tracking_and_metrics_count_running(engine):
    # Why the supervisor drains on /metrics: /load says 0 unless the server tracks load.
    # /load is read between two facts: /metrics counted the request running, and the request
    # had not finished when /load answered. Reading /metrics again after /load raced the end of
    # a short answer on a fast machine (CI saw 0 running), so the answer is long and the second
    # fact is the client's own.
    thread, out = in_background(engine, long_chat(400))
    wait_running(engine, out)
    load = engine.get("/load").json()
    unfinished_when_read = "status" not in out
    thread.join(120)
    assert unfinished_when_read, "the request ended before /load answered: lengthen it"
    assert load == {"server_load": 0}
    assert out["status"] == 200
