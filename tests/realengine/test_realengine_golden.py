"""Golden probes on real vLLM: greedy and seeded, a model answers the same across a sleep.

Random weights are still deterministic at temperature 0 with a seed, so the tiny model gives
the control plane a real fingerprint to keep; a level-1 sleep and wake must not change it.
"""

from __future__ import annotations

import time

import httpx
import pytest

from fleets.core.golden import (
    GOLDEN_SEED,
    ProbeAnswer,
    Recorded,
    Verdict,
    answer_sha256,
    judge,
    key_for,
    request_fingerprint,
)
from tests.realengine.conftest import MODEL, supervisor_client

pytestmark = pytest.mark.realengine

PROBE = {"prompt": "Count: one two three", "maxTokens": 8, "timeoutMs": 120_000}


def golden_probe(client) -> dict:
    body = client.post("/v1/probe", json={**PROBE, "seed": GOLDEN_SEED}).json()
    assert body["ok"] is True, body
    (result,) = [r for r in body["results"] if r["model"] == MODEL]
    return result


def model_status(client) -> dict:
    status = client.get("/v1/status").json()
    (entry,) = [m for s in status["slots"] for m in s.get("models", ()) if m["name"] == MODEL]
    return entry


def is_sleeping(port: int) -> bool:
    """vLLM's own answer, asked directly (not the supervisor's reading of it)."""
    response = httpx.get(f"http://127.0.0.1:{port}/is_sleeping", timeout=10, trust_env=False)
    response.raise_for_status()
    return response.json()["is_sleeping"]


def as_answer(result: dict) -> ProbeAnswer:
    return ProbeAnswer(
        result["model"], "", result["ok"], None, result["answer"], result.get("engineVersion")
    )


def test_a_golden_probe_recorded_before_sleep_matches_after_wake(engines):
    request = request_fingerprint(PROBE["prompt"], PROBE["maxTokens"])
    profile = {"engine": "vllm", "model": MODEL}
    with supervisor_client(engines.east.url) as east:
        status = east.get("/v1/status").json()
        assert "probe.golden" in status["features"]
        before = golden_probe(east)
        assert before["answer"], before
        assert before.get("engineVersion"), before  # vLLM's GET /version
        key = key_for(as_answer(before), profile=profile, request=request)
        baselines = {key: Recorded(answer_sha256(before["answer"]), before["answer"])}

        assert east.post("/v1/vllm/sleep").status_code == 200
        # The model really slept between the two probes: vLLM says so, and so does the
        # supervisor's status, which also reports the engine's version (read in the background).
        asleep = model_status(east)
        assert asleep["sleeping"] is True, asleep
        assert is_sleeping(asleep["port"]) is True
        deadline = time.monotonic() + 10
        while "engineVersion" not in asleep and time.monotonic() < deadline:
            time.sleep(0.2)
            asleep = model_status(east)
        assert asleep.get("engineVersion") == before["engineVersion"], asleep
        assert east.post("/v1/vllm/wake").status_code == 200
        awake = model_status(east)
        assert awake["sleeping"] is False and is_sleeping(awake["port"]) is False
        after = golden_probe(east)

    verdict = judge(
        as_answer(after),
        model=MODEL,
        adapter="",
        profile=profile,
        request=request,
        deterministic=True,
        golden=True,
        baselines=baselines,
    )
    assert verdict.verdict == Verdict.MATCH, (before["answer"], after["answer"])
