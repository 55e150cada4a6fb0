"""The supervisor client: validated bodies, classified errors, the token kept out of messages."""

from __future__ import annotations

import json

import httpx
import pytest

from common.wire.shape import compact
from fleets.metrics import reconcile as fleet_metrics
from fleets.reconciler.supervisor.client import SupervisorClient, gpu_facts_unavailable
from fleets.reconciler.supervisor.transport import use_transport

TOKEN = "s3cret-supervisor-token-xyz"


def client_answering(handler) -> SupervisorClient:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return SupervisorClient("https://sup.example:8701/", token=TOKEN, http=http)


def ok_status() -> dict:
    return {
        "slots": [
            {
                "gpuIndex": 0,
                "kind": "inference",
                "models": [
                    {"name": "a", "port": 8001, "sleeping": True, "fingerprint": "x"},
                    {"name": "b", "port": 8002, "sleeping": None},
                ],
                "training": None,
            },
            {"gpuIndex": 0, "kind": "training", "training": {"state": "running", "pids": [7]}},
        ],
        "ready": True,
        "extra": {"ignored": True},
    }


def test_status_is_validated_and_sends_the_bearer_token():
    seen = {}

    def handler(request):
        seen["auth"] = request.headers.get("authorization")
        seen["path"] = request.url.path
        return httpx.Response(200, json=ok_status())

    call = client_answering(handler).status(timeout=1)
    assert call.ok
    assert seen == {"auth": f"Bearer {TOKEN}", "path": "/v1/status"}
    report = call.value
    assert report.ready is True
    assert report.model("a").sleeping is True
    assert report.model("b").sleeping is None  # unknown
    assert report.training(0).running_with_pid
    assert report.raw["extra"] == {"ignored": True}


def test_a_whole_number_where_the_contract_says_integer_is_read_as_that_int():
    # The wire's one integer rule: JSON Schema's `integer` and the original take 7.0 as 7,
    # and whoever reads the body after the check holds the int (`pids`, `gpuIndex`, `port`).
    body = (
        b'{"ready": true, "slots": [{"gpuIndex": 0.0, "kind": "inference",'
        b' "models": [{"name": "a", "port": 8001.0, "sleeping": false}]},'
        b' {"gpuIndex": 1.0, "kind": "training", "training": {"state": "running",'
        b' "pids": [7.0]}}]}'
    )
    call = client_answering(lambda r: httpx.Response(200, content=body)).status(timeout=1)
    assert call.ok, call.error
    slots = call.value.raw["slots"]
    assert [type(s["gpuIndex"]) for s in slots] == [int, int]
    assert type(slots[0]["models"][0]["port"]) is int
    assert call.value.training(1).pids == (7,) and type(call.value.training(1).pids[0]) is int
    half = body.replace(b"[7.0]", b"[7.5]")
    refused = client_answering(lambda r: httpx.Response(200, content=half)).status(timeout=1)
    assert refused.error.kind == "bad_body" and "slots[1].training.pids[0]" in refused.error.message


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"slots": "nope"}',
        b'{"slots": [{"gpuIndex": "0", "kind": "inference"}]}',
        b'{"slots": [{"gpuIndex": 0, "kind": "gpu"}]}',
        b'{"slots": [{"gpuIndex": 0, "kind": "training", "training": {"pids": [1]}}]}',
        # The contract says boolean or null; the supervisor maps anything else to null.
        b'{"ready": false, "slots": [{"gpuIndex": 0, "kind": "inference",'
        b' "models": [{"name": "a", "port": 1, "sleeping": "maybe"}]}]}',
        b"[]",
    ],
)
def test_a_malformed_body_is_an_error_result_never_an_exception(body):
    call = client_answering(lambda r: httpx.Response(200, content=body)).status(timeout=1)
    assert not call.ok
    assert call.error.kind == "bad_body"


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_is_unauthorized_and_the_token_is_never_echoed(status):
    def handler(request):
        return httpx.Response(status, json={"error": {"code": "unauthorized", "message": TOKEN}})

    call = client_answering(handler).wake(timeout=1)
    assert call.unauthorized
    assert TOKEN not in call.error.message


def test_an_error_envelope_keeps_the_supervisors_code():
    def handler(request):
        return httpx.Response(
            502, json={"error": {"code": "wake_failed", "message": "wake failed for 1 model(s)"}}
        )

    call = client_answering(handler).wake(timeout=1)
    assert call.error.kind == "http" and call.error.status == 502
    assert call.error.code == "wake_failed"
    assert "wake failed for 1 model" in call.error.message


def test_network_errors_and_timeouts_are_classified_and_counted():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    def slow(request):
        raise httpx.ReadTimeout("timed out", request=request)

    before = fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call="status", kind="network")._value.get()
    network = client_answering(refuse).status(timeout=1)
    timeout = client_answering(slow).status(timeout=1)
    assert network.error.kind == "network" and "ConnectError" in network.error.message
    assert timeout.error.kind == "timeout"
    after = fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call="status", kind="network")._value.get()
    assert after == before + 1


def test_probe_posts_the_policy_and_the_bound_models():
    seen = {}

    def handler(request):
        seen.update(json.loads(request.content))
        seen["query"] = request.url.params.get_list("model")
        return httpx.Response(
            200,
            json={
                "ok": False,
                "results": [{"model": "a", "ok": False, "latencyMs": 3, "error": "x"}],
            },
        )

    call = client_answering(handler).probe(
        prompt="ping", max_tokens=4, timeout_ms=900, models=["a"], timeout=1
    )
    # Nothing learned yet: the body carries `models`; the query carries the original's selector.
    assert seen == {
        "prompt": "ping",
        "maxTokens": 4,
        "timeoutMs": 900,
        "models": ["a"],
        "query": ["a"],
    }
    assert call.value.result("a").error == "x"


def test_an_engine_version_longer_than_its_columns_is_cut_not_a_failed_write():
    # Any supervisor may send one (the columns are 64 characters); both the status and the
    # probe path keep the first 64, as a binding's and a baseline's column can hold them.
    long = "v" * 200
    status = ok_status()
    status["slots"][0]["models"][0]["engineVersion"] = long
    report = client_answering(lambda r: httpx.Response(200, json=status)).status(timeout=1).value
    assert report.model("a").engine_version == long[:64]
    assert report.model("b").engine_version is None
    answer = {
        "ok": True,
        "results": [{"model": "a", "ok": True, "latencyMs": 3, "engineVersion": long}],
    }
    probe = client_answering(lambda r: httpx.Response(200, json=answer)).probe(
        prompt="ping", max_tokens=4, timeout_ms=900, models=["a"], timeout=1
    )
    assert probe.value.result("a").engine_version == long[:64]


def test_gpu_memory_rejects_nonsense_numbers():
    body = {"gpus": [{"index": 0, "usedMiB": 10, "totalMiB": 0}]}
    call = client_answering(lambda r: httpx.Response(200, json=body)).gpu_memory(timeout=1)
    assert call.error.kind == "bad_body"


def gpu_body() -> dict:
    """A `/v1/gpu/memory` body as `supervisor/gpu/facts.py` writes it."""
    return {
        "gpus": [
            {
                "index": 0,
                "usedMiB": 46000,
                "totalMiB": 81920,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-1",
                "computeCapability": "9.0",
                "processes": [
                    {"pid": 11, "usedMiB": 6000, "name": None},
                    {"pid": 12, "usedMiB": None},
                ],
                "mig": None,
            },
            {
                "index": 1,
                "usedMiB": 20,
                "totalMiB": 80,
                "processes": [],
                "mig": {
                    "enabled": True,
                    "instances": [
                        {"usedMiB": 20, "totalMiB": 40, "processes": [{"pid": 13, "usedMiB": 20}]}
                    ],
                },
            },
        ],
        "backend": "nvml",
    }


def test_gpu_memory_is_validated_and_keeps_the_body_for_the_dashboard():
    call = client_answering(lambda r: httpx.Response(200, json=gpu_body())).gpu_memory(timeout=1)
    assert call.ok
    assert call.value.gpu(0).used_ratio == pytest.approx(46000 / 81920)
    assert call.value.raw == compact(gpu_body())  # nulls read as absent


@pytest.mark.parametrize(
    "breakage",
    [
        lambda g: g.update(processes="nope"),
        lambda g: g.update(processes=[{"pid": "11", "usedMiB": 1}]),
        lambda g: g.update(processes=[{"pid": 11, "usedMiB": "lots"}]),
        lambda g: g.update(mig={"instances": [{"processes": [7]}]}),
        lambda g: g.update(mig="yes"),
    ],
)
def test_gpu_memory_with_malformed_processes_is_a_bad_body(breakage):
    body = gpu_body()
    breakage(body["gpus"][0])
    call = client_answering(lambda r: httpx.Response(200, json=body)).gpu_memory(timeout=1)
    assert call.error.kind == "bad_body"


def test_gpu_memory_501_means_no_gpu_facts_and_is_not_counted_as_an_error():
    def handler(request):
        body = {"error": {"code": "gpu_unavailable", "message": "NVML library not found"}}
        return httpx.Response(501, json=body)

    errors = fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call="gpu_memory", kind="http")
    before = errors._value.get()
    call = client_answering(handler).gpu_memory(timeout=1)
    assert gpu_facts_unavailable(call.error)
    assert call.error.code == "gpu_unavailable"
    assert errors._value.get() == before
    failed = client_answering(lambda r: httpx.Response(502, json={})).gpu_memory(timeout=1)
    assert not gpu_facts_unavailable(failed.error)


def test_a_sleep_tells_a_draining_supervisor_how_long_the_step_still_waits():
    seen: list[str] = []

    def handler(request):
        seen.append(str(request.url))
        if request.url.path == "/v1/status":
            return httpx.Response(200, json={**ok_status(), "features": ["sleep.drain"]})
        return httpx.Response(200, json={"status": "ok"})

    client = client_answering(handler)
    assert client.status(timeout=1).ok
    assert client.sleep(timeout=5, budget=12.5).ok
    assert client.sleep(timeout=5).ok
    assert seen[1].endswith("/v1/vllm/sleep?waitMs=4000&budgetMs=12500")
    assert seen[2].endswith("/v1/vllm/sleep?waitMs=4000")  # no budget stated, none sent


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (["sleep.drain", "drain-bound"], "/v1/vllm/sleep?waitMs=4000&drainMs=3000"),
        (["drain-bound"], "/v1/vllm/sleep?drainMs=3000"),
        (["sleep.drain"], "/v1/vllm/sleep?waitMs=4000"),  # an older supervisor of ours
        (None, "/v1/vllm/sleep"),  # the original: nothing beyond its contract
    ],
)
def test_a_drain_bound_goes_only_to_a_supervisor_that_lists_it(features, expected):
    seen: list[str] = []

    def handler(request):
        seen.append(str(request.url))
        if request.url.path == "/v1/status":
            body = ok_status() if features is None else {**ok_status(), "features": features}
            return httpx.Response(200, json=body)
        return httpx.Response(200, json={"status": "ok"})

    client = client_answering(handler)
    assert client.status(timeout=1).ok
    assert client.sleep(timeout=5, drain_bound_ms=3000).ok
    assert seen[1].endswith(expected)
    assert client.takes_drain_bound() is ("drain-bound" in (features or []))


def test_a_drain_bound_of_zero_is_sent_as_zero():
    seen: list[str] = []

    def handler(request):
        seen.append(str(request.url))
        if request.url.path == "/v1/status":
            return httpx.Response(200, json={**ok_status(), "features": ["drain-bound"]})
        return httpx.Response(200, json={"status": "ok"})

    client = client_answering(handler)
    assert client.status(timeout=1).ok
    assert client.sleep(timeout=5, drain_bound_ms=0).ok
    assert seen[1].endswith("/v1/vllm/sleep?drainMs=0")


def test_a_cookie_one_supervisor_sets_never_reaches_another():
    # httpx keys cookies by host, not port: a jar would carry one supervisor's cookie to every
    # other supervisor on that host. The shared client keeps none.
    sent = []

    def handler(request):
        sent.append(request.headers.get("cookie"))
        return httpx.Response(200, headers={"set-cookie": "session=abc123"}, json=ok_status())

    previous = use_transport(httpx.MockTransport(handler))
    try:
        first = SupervisorClient("https://sup.example:8701", token=TOKEN).status(timeout=1)
        second = SupervisorClient("https://sup.example:8702", token=TOKEN).status(timeout=1)
    finally:
        use_transport(previous)
    assert first.ok and second.ok
    assert sent == [None, None]
