"""Our supervisor and control plane with real vLLM servers behind them.

East's supervisor starts its vLLM itself from a profile (the `python -m` entry point, no
`--enable-sleep-mode` on CPU, an API key by reference); west's supervisor drives the shared
unmanaged vLLM. Simulated GPU facts and trainers; real model servers.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet, Operation
from fleets.reconciler.tick import tick_run
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_request
from tests.realengine.conftest import (
    EAST_KEY,
    MODEL,
    SUPERVISOR_TOKEN,
    start_supervisor,
    stop,
    supervisor_client,
    trainer_slot,
)

pytestmark = pytest.mark.realengine


def model_status(client) -> dict:
    status = client.get("/v1/status").json()
    return next(m for s in status["slots"] for m in s.get("models", ()))


def test_managed_vllm_reports_its_fingerprint_sleeps_wakes_and_passes_the_keyed_probe(engines):
    with supervisor_client(engines.east.url) as east:
        model = model_status(east)
        assert model["fingerprint"].startswith("sha256:")
        assert model["process"]["state"] == "running" and model["sleeping"] is False
        assert east.post("/v1/vllm/sleep").status_code == 200
        assert model_status(east)["sleeping"] is True
        assert east.post("/v1/vllm/wake").status_code == 200
        assert model_status(east)["sleeping"] is False
        probe = east.post("/v1/probe", json={"timeoutMs": 60_000}).json()
        assert probe["ok"] is True, probe  # vLLM was started with --api-key (VLLM_API_KEY)
        text = east.get("/v1/status").text + engines.east.log.read_text()
        assert EAST_KEY not in text
    # And the key is really required: without it the server refuses.
    refused = httpx.post(
        f"http://127.0.0.1:{engines.east_model_port}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
        trust_env=False,
    )
    assert refused.status_code == 401


def test_a_probe_prompt_with_a_lone_surrogate_gets_a_200_from_the_supervisor(engines):
    # Issue 28: the supervisor answered 500 (UnicodeEncodeError); the original answers 200. It
    # forwards the escape as the caller sent it, and reports what the real vLLM made of it.
    with supervisor_client(engines.east.url) as east:
        answer = east.post(
            "/v1/probe",
            content=b'{"prompt": "ping \\ud800", "maxTokens": 4, "timeoutMs": 60000}',
            headers={"content-type": "application/json"},
        )
        assert answer.status_code == 200, answer.text
        [result] = answer.json()["results"]
        assert result["model"] == MODEL
        # vLLM 0.32's tokenizer refuses the lone surrogate (400), as it would from the original
        # supervisor (JSON.stringify escapes it the same way): a failed probe, named, not a 500.
        assert result["ok"] is False and result["error"].startswith("HTTP 400"), result


def test_sleep_through_the_supervisor_drains_a_running_request_first(engines):
    key = {"Authorization": f"Bearer {EAST_KEY}"}
    out: dict = {}

    def generate() -> None:
        response = httpx.post(
            f"http://127.0.0.1:{engines.east_model_port}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 16,
                "ignore_eos": True,
            },
            headers=key,
            timeout=120,
            trust_env=False,
        )
        out["finish"] = response.json()["choices"][0]["finish_reason"]

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(0.5)
    with supervisor_client(engines.east.url) as east:
        slept = east.post("/v1/vllm/sleep")
        assert slept.status_code == 200
        thread.join(120)
        assert out["finish"] == "length"  # it finished; the sleep did not abort it
        assert model_status(east)["sleeping"] is True
        east.post("/v1/vllm/wake")


@pytest.fixture
def west(engines):
    config = {
        "host": "west",
        "gpu": {"backend": "sim", "simStateFile": str(engines.workdir / "west-gpu.json")},
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [{"name": MODEL, "port": engines.plain.port}],
            },
            trainer_slot(engines.workdir / "west-ckpt"),
        ],
    }
    served = start_supervisor(engines.workdir, "west", config, {})
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{served.url}/healthz", timeout=2, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, served.log.read_text()[-2000:]
        time.sleep(0.2)
    yield served
    stop(served.proc)
    with httpx.Client(base_url=engines.plain.url, trust_env=False, timeout=30) as plain:
        plain.post("/wake_up")


POLICY = {
    "autoFailover": False,
    "heartbeatStaleMs": 5000,
    "degradedGraceMs": 10000,
    "trainingStopGraceMs": 2000,
    "stopTrainingTimeoutMs": 20000,
    "verifyGpuTimeoutMs": 10000,
    "wakeTimeoutMs": 60000,
    "probeTimeoutMs": 60000,
    "switchActiveTimeoutMs": 10000,
    "sleepTimeoutMs": 60000,
    "startTrainingTimeoutMs": 20000,
}


def domain(slug: str, priority: int, supervisor: str, model_url: str, ckpt) -> dict:
    return {
        "slug": slug,
        "provider": "static",
        "priority": priority,
        "supervisorUrl": supervisor,
        "servingBaseUrl": model_url,
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "sleepLevel": 1,
                "models": [{"name": MODEL, "servingUrl": model_url}],
            },
            {
                "kind": "training",
                "gpuIndex": 0,
                "command": ["python3", "-m", "supervisor.sim.trainer"],
                "checkpointDir": str(ckpt),
            },
        ],
    }


@pytest.mark.django_db(transaction=True)
def test_a_promotion_and_back_across_two_domains_of_real_vllm(engines, west, settings):

    settings.HARU = {**settings.HARU, "supervisor_token": SUPERVISOR_TOKEN}
    # West starts as a standby: its model asleep, its trainer running.
    with supervisor_client(west.url) as w:
        assert w.post("/v1/vllm/sleep").status_code == 200
        assert w.post("/v1/training/start").status_code == 200
    layout = {
        "slug": "real",
        "activeDomainSlug": "east",
        "policy": POLICY,
        "domains": [
            domain(
                "east",
                10,
                engines.east.url,
                f"http://127.0.0.1:{engines.east_model_port}",
                engines.workdir / "east-ckpt",
            ),
            domain("west", 20, west.url, engines.plain.url, engines.workdir / "west-ckpt"),
        ],
    }
    layout_apply(layout=parse_layout(layout))
    fleet = Fleet.objects.get(slug="real")

    def drive(until, timeout: float = 240.0):
        deadline = time.monotonic() + timeout
        while not (value := until()):
            assert time.monotonic() < deadline, "not reached in time"
            tick_run(fleet_id=fleet.id, wait_s=5, poll_s=0.5)
            time.sleep(0.2)
        return value

    def finished(op):
        def check():
            op.refresh_from_db()
            return op if op.state not in ("pending", "running") else None

        return check

    drive(lambda: all(d.last_seen_at for d in Domain.objects.filter(fleet=fleet)))
    for target in ("west", "east"):
        op = operation_request(
            fleet=fleet,
            kind="promote",
            target_domain_id=Domain.objects.get(fleet=fleet, slug=target).id,
        ).operation
        op = drive(finished(op))
        assert op.state == "succeeded", op.error
        fleet.refresh_from_db()
        assert fleet.active_domain.slug == target
        done = set(Operation.objects.get(pk=op.pk).events.values_list("step", flat=True).distinct())
        assert {"wake", "probe", "switch_route"} <= done
    with supervisor_client(west.url) as w:
        status = w.get("/v1/status").json()
        assert model_status(w)["sleeping"] is True  # demoted again: asleep...
        trainer = next(s["training"] for s in status["slots"] if s["kind"] == "training")
        assert trainer["state"] == "running"  # ...and training
