"""Swapping a model server to a new profile (POST /v1/models/swap), over scripted processes.

The real simulated engine through a real supervisor, a restart included, is in
test_supervisor_swap_processes.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import signal
import time
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from common.strict_json import ConfigError
from common.wire.contract import check_response
from common.wire.shape import FEATURE_MODEL_SWAP
from supervisor.api import create_app
from supervisor.config import parse_config
from supervisor.gpu.nvml import NvmlBackend
from supervisor.host import Host, HostDeps
from supervisor.records import StateDir
from tests.supervisor.conftest import REPO_ROOT
from tests.supervisor.fakes import FakeModelServers, FakeNvml, FakeServerState, FakeSpawner

OLD, NEW = 18001, 18100
SECRET = "sk-swapped-server-key-0123456789abcdef"
NEW_PROFILE = {"engine": "sim", "extraArgs": ["--reply", "version two"]}


def config(**extra) -> dict:
    return {
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {
                        "name": "qwen-small",
                        "port": OLD,
                        "profile": {"engine": "sim", "extraArgs": ["--reply", "version one"]},
                    },
                    {"name": "attached", "port": 18002},
                ],
            }
        ],
        "swapPorts": {"first": NEW, "last": NEW + 1},
        **extra,
    }


def checked(app) -> TestClient:
    client = TestClient(app)
    client.event_hooks = {"request": [], "response": [check_response]}
    return client


def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def model(client, name: str = "qwen-small") -> dict:
    models = client.get("/v1/status").json()["slots"][0]["models"]
    return next(m for m in models if m["name"] == name)


def swap_state(client) -> str | None:
    return model(client).get("swap", {}).get("state")


def servers(**new) -> dict[int, FakeServerState]:
    return {
        OLD: FakeServerState("qwen-small"),
        18002: FakeServerState("attached"),
        NEW: FakeServerState("qwen-small", **new),
    }


def started(client, spawner) -> None:
    until(lambda: len(spawner.spawned) == 1 and model(client)["sleeping"] is False)


def test_status_lists_the_feature(api):
    under_test = api(config(), servers=servers())
    with checked(under_test.app) as client:
        assert FEATURE_MODEL_SWAP in client.get("/v1/status").json()["features"]
        assert "swap" not in model(client)  # no swap yet: the field is left out


def test_new_port_starts_beside_probes_then_switches_and_stops_the_old(api):
    spawner = FakeSpawner()
    fakes = servers()
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        old_pid = model(client)["process"]["pid"]
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        answer = client.post("/v1/models/swap", json=body)
        assert answer.status_code == 202
        assert answer.json() == {
            "status": "swapping",
            "model": "qwen-small",
            "mode": "new-port",
            "port": NEW,
            "previousPort": OLD,
        }
        until(lambda: swap_state(client) == "switched")
        now = model(client)
        assert now["port"] == NEW
        assert now["process"]["pid"] != old_pid and now["process"]["state"] == "running"
        assert now["sleeping"] is False
        assert now["swap"]["previousPort"] == OLD and now["swap"]["mode"] == "new-port"
        assert "endedAt" in now["swap"] and "error" not in now["swap"]
        old, new = spawner.spawned
        assert "version two" in new.argv and str(NEW) in new.argv
        assert old.signals[0] == signal.SIGTERM and old.returncode is not None
        assert new.signals == []
        # Probed before the switch: one short completion on the new port.
        assert fakes[NEW].chat_bodies and fakes[NEW].chat_bodies[0]["max_tokens"] == 4
        # The served name now points to the new server: sleep and wake reach it.
        assert client.post("/v1/vllm/sleep").status_code == 200
        assert fakes[NEW].sleeping is True and model(client)["sleeping"] is True
        assert client.post("/v1/vllm/wake").status_code == 200
        assert client.post("/v1/probe", json={"models": ["qwen-small"]}).json()["ok"] is True


def test_new_port_whose_probe_fails_leaves_the_old_server_serving(api):
    spawner = FakeSpawner()
    fakes = servers(chat_status=500)
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "failed")
        now = model(client)
        assert now["port"] == OLD and now["process"]["state"] == "running"
        assert now["swap"]["error"].startswith("probing: probe failed: HTTP 500")
        assert "the old server kept serving" in now["swap"]["error"]
        old, new = spawner.spawned
        assert old.signals == [] and old.returncode is None
        assert new.returncode is not None
        # A failed swap does not block the next one.
        fakes[NEW].chat_status = 200
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "switched")
        assert model(client)["port"] == NEW


def test_in_place_stops_the_old_first_and_reuses_its_port(api):
    spawner = FakeSpawner()
    under_test = api(config(), servers=servers(), spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "in-place", "profile": NEW_PROFILE}
        answer = client.post("/v1/models/swap", json=body).json()
        assert answer["port"] == OLD and answer["previousPort"] == OLD
        until(lambda: swap_state(client) == "switched")
        old, new = spawner.spawned
        assert old.returncode is not None and "version two" in new.argv
        assert str(OLD) in new.argv
        assert model(client)["port"] == OLD and model(client)["process"]["pid"] == new.pid


def test_in_place_failure_starts_the_old_profile_again(api):
    spawner = FakeSpawner()
    fakes = servers()
    fakes[OLD].chat_status = 500  # the new server answers on the old one's port, and fails
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "in-place", "profile": NEW_PROFILE}
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "failed")
        old, new, again = spawner.spawned
        assert old.returncode is not None and new.returncode is not None
        assert again.argv == old.argv and again.returncode is None
        now = model(client)
        assert now["process"]["pid"] == again.pid and now["port"] == OLD
        assert "started again from its old profile" in now["swap"]["error"]


BAD_BODIES = [
    ({"model": "nope", "mode": "in-place", "profile": NEW_PROFILE}, 404, "no model nope"),
    (
        {"model": "qwen-small", "mode": "in-place", "profile": {"engine": "nope"}},
        400,
        'profile.engine: unknown engine "nope"',
    ),
    (
        {"model": "qwen-small", "mode": "in-place", "profile": {"engine": "sim", "gpus": [3]}},
        400,
        "do not include the model's slot GPU 0",
    ),
    (
        {"model": "qwen-small", "mode": "sideways", "profile": NEW_PROFILE},
        400,
        'mode: must be "new-port" or "in-place"',
    ),
    ({"model": "qwen-small", "mode": "in-place"}, 400, "profile"),
    (
        {"model": "qwen-small", "mode": "in-place", "profile": NEW_PROFILE, "extra": 1},
        400,
        "extra: is not a known field",
    ),
    (
        {"model": "attached", "mode": "in-place", "profile": NEW_PROFILE},
        400,
        "only a managed server can be swapped",
    ),
    (
        {
            "model": "qwen-small",
            "mode": "in-place",
            "profile": {"engine": "sim", "extraArgs": ["x" * 100] * 200},
        },
        400,
        "bytes of JSON; at most 16384",
    ),
    (
        {"model": "qwen-small", "mode": "in-place", "profile": NEW_PROFILE, "apiKey": {}},
        400,
        'apiKey: must name exactly one of "env"',
    ),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD_BODIES)
def test_bad_requests_are_refused_with_nothing_changed(api, body, status, says):
    spawner = FakeSpawner()
    under_test = api(config(), servers=servers(), spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        answer = client.post("/v1/models/swap", json=body)
        assert answer.status_code == status
        assert says in answer.json()["error"]["message"]
        assert len(spawner.spawned) == 1 and spawner.spawned[0].signals == []
        assert "swap" not in model(client)


def test_new_port_needs_a_configured_range(api):
    spawner = FakeSpawner()
    bare = config()
    del bare["swapPorts"]
    under_test = api(bare, servers=servers(), spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        answer = client.post("/v1/models/swap", json=body)
        assert answer.status_code == 400
        assert "needs swapPorts" in answer.json()["error"]["message"]
        assert len(spawner.spawned) == 1


def test_a_second_swap_on_the_gpu_is_refused_while_one_is_in_flight(api):
    spawner = FakeSpawner()
    fakes = servers(reachable=False)  # the new server never gets healthy: the swap waits
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "starting")
        again = client.post("/v1/models/swap", json=body)
        assert again.status_code == 409 and again.json()["error"]["code"] == "swap_busy"
        assert len(spawner.spawned) == 2
    # Leaving the app (shutdown) stops the new server of the swap in flight too.
    assert all(child.returncode is not None for child in spawner.spawned)


def test_a_swap_is_refused_while_a_sleep_of_that_gpu_is_in_flight(api):
    spawner = FakeSpawner()
    fakes = servers()
    fakes[OLD].running = [1]  # a request runs: the sleep drains (drainBudgetMs) before sleeping
    under_test = api(config(drainBudgetMs=60_000), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        assert client.post("/v1/vllm/sleep?waitMs=50").status_code == 202
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        answer = client.post("/v1/models/swap", json=body)
        assert answer.status_code == 409
        assert "a sleep or wake of qwen-small is in flight" in answer.json()["error"]["message"]
        fakes[OLD].running = [0]
        until(lambda: model(client)["sleeping"] is True)
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "switched")


def test_the_new_servers_api_key_is_used_and_never_shown(api, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    spawner = FakeSpawner()
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    fakes = servers(api_key=SECRET)
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {
            "model": "qwen-small",
            "mode": "new-port",
            "profile": {"engine": "vllm", "modelPath": "/models/qwen-v2"},
            "apiKey": {"file": str(key_file)},
        }
        answer = client.post("/v1/models/swap", json=body)
        assert answer.status_code == 202
        until(lambda: swap_state(client) == "switched")
        new = spawner.spawned[1]
        assert new.env["VLLM_API_KEY"] == SECRET and SECRET not in " ".join(new.argv)
        status = client.get("/v1/status")
        for text in (answer.text, status.text, caplog.text):
            assert SECRET not in text
        missing = {**body, "apiKey": {"env": "NO_SUCH_KEY_VARIABLE"}}
        refused = client.post("/v1/models/swap", json=missing)
        assert refused.status_code == 400
        assert "NO_SUCH_KEY_VARIABLE" in refused.json()["error"]["message"]


# -- restarts: the swap is recorded in the state dir --------------------------------------------


def host_over(cfg: dict, state: StateDir, spawner: FakeSpawner, fakes) -> Host:
    transport = httpx.MockTransport(FakeModelServers(fakes))

    async def never_in_use(port: int) -> bool:
        return False

    return Host(
        parse_config(cfg, cwd=REPO_ROOT),
        HostDeps(
            gpu=NvmlBackend(load=lambda: FakeNvml([], init_error=12)),
            spawner=spawner,
            environ={"PATH": "/usr/bin"},
            http_factory=lambda: httpx.AsyncClient(transport=transport),
            port_in_use=never_in_use,
            state=state,
        ),
    )


def swap_then_restart(cfg: dict, tmp_path: Path, restarted_cfg: dict) -> tuple[dict, FakeSpawner]:
    state = StateDir(tmp_path / "state")
    first = host_over(cfg, state, FakeSpawner(), servers())
    with checked(create_app(first, token=None)) as client:
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        until(lambda: model(client)["sleeping"] is False)
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "switched")
    assert [p.name for p in state.path.glob("swap-*.json")]
    spawner = FakeSpawner()
    second = host_over(restarted_cfg, state, spawner, servers())
    with checked(create_app(second, token=None)) as client:
        until(lambda: len(spawner.spawned) == 1)
        return model(client), spawner


def test_a_restart_after_a_swap_runs_the_swapped_profile_not_the_configs(tmp_path):
    after, spawner = swap_then_restart(config(), tmp_path, config())
    assert after["port"] == NEW
    assert after["swap"]["state"] == "switched" and after["swap"]["recorded"] is True
    assert after["swap"]["previousPort"] == OLD
    assert "version two" in spawner.spawned[0].argv and str(NEW) in spawner.spawned[0].argv


def test_an_edited_config_entry_wins_over_a_recorded_swap(tmp_path):
    edited = copy.deepcopy(config())
    edited["slots"][0]["models"][0]["profile"]["extraArgs"] = ["--reply", "version three"]
    after, spawner = swap_then_restart(config(), tmp_path, edited)
    assert after["port"] == OLD and "swap" not in after
    assert "version three" in spawner.spawned[0].argv
    assert list((tmp_path / "state").glob("swap-*.json")) == []


def test_swapping_back_to_the_configs_profile_forgets_the_record(tmp_path):
    state = StateDir(tmp_path / "state")
    spawner = FakeSpawner()
    host = host_over(config(), state, spawner, servers())
    original = config()["slots"][0]["models"][0]["profile"]

    async def scenario() -> None:
        await host.start()
        try:
            await host.begin_swap(model="qwen-small", profile=NEW_PROFILE, mode="in-place")
            await host._swap_tasks["qwen-small"]
            assert host._swaps["qwen-small"].state == "switched"
            assert len(list(state.path.glob("swap-*.json"))) == 1
            await host.begin_swap(model="qwen-small", profile=original, mode="in-place")
            await host._swap_tasks["qwen-small"]
            assert host._swaps["qwen-small"].state == "switched"
            # The config's own profile on the config's port: nothing left to remember.
            assert list(state.path.glob("swap-*.json")) == []
        finally:
            await host.shutdown()

    asyncio.run(scenario())


# -- the config's swapPorts ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ports", "says"),
    [
        ({"first": 18200, "last": 18199}, "swapPorts.last: must be at least first (18200)"),
        ({"first": 18000, "last": 18010}, "slots[0].models[0].port 18001 is inside the range"),
        ({"first": 20000, "last": 30000}, "swapPorts: spans 10001 ports; at most 1024"),
        ({"first": 20000}, "swapPorts"),
        ({"first": 20000, "last": 20001, "step": 1}, "swapPorts.step: is not a known field"),
    ],
)
def test_the_swap_port_range_is_checked(ports, says):
    with pytest.raises(ConfigError) as refused:
        parse_config({**config(), "swapPorts": ports}, cwd=REPO_ROOT)
    assert any(says in e for e in refused.value.errors), refused.value.errors


# -- the original control plane's view ----------------------------------------------------------


def test_the_originals_status_schema_accepts_a_status_with_a_swap(api):
    original = json.loads((REPO_ROOT / "tests/wire/original/status.response.json").read_text())
    spawner = FakeSpawner()
    fakes = servers(reachable=False)
    under_test = api(config(), servers=fakes, spawner=spawner)
    with checked(under_test.app) as client:
        started(client, spawner)
        body = {"model": "qwen-small", "mode": "new-port", "profile": NEW_PROFILE}
        assert client.post("/v1/models/swap", json=body).status_code == 202
        until(lambda: swap_state(client) == "starting")
        in_flight = client.get("/v1/status").json()
        fakes[NEW].reachable = True
        until(lambda: swap_state(client) == "switched")
        switched = client.get("/v1/status").json()
    for status in (in_flight, switched):
        assert "swap" in status["slots"][0]["models"][0]
        assert list(Draft202012Validator(original).iter_errors(status)) == []
