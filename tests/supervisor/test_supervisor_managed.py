"""Managed servers: started from their profile, restarted with backoff, stopped for standby."""

from __future__ import annotations

import asyncio
import signal
import time

from starlette.testclient import TestClient

from common.wire.contract import check_response
from supervisor.engines.launch import LaunchCommand, redact_argv
from supervisor.managed import BACKOFF, CONFLICT, RUNNING, STOPPED, ManagedProcess
from tests.supervisor.fakes import FakeServerState, FakeSpawner

LAUNCH = LaunchCommand(
    argv=("engine", "--port", "9000"),
    env={"PATH": "/bin"},
    generated_env={},
    fingerprint="sha256:x",
    serves_http=True,
)


class RecordingClock:
    """Real monotonic time, but sleeps are recorded and only yield."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


async def until(predicate, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.001)


def managed(spawner, clock=None, in_use=None, **kwargs) -> ManagedProcess:
    async def port_in_use(port: int) -> bool:
        return bool(in_use and in_use())

    return ManagedProcess(
        "qwen",
        LAUNCH,
        9000,
        spawner=spawner,
        clock=clock or RecordingClock(),
        port_in_use=port_in_use,
        **kwargs,
    )


def test_a_dead_server_is_restarted_with_exponential_backoff():
    async def scenario():
        spawner, clock = FakeSpawner(), RecordingClock()
        m = managed(spawner, clock, backoff_initial_s=1, backoff_max_s=4)
        m.start()
        for n in range(1, 5):
            await until(lambda n=n: len(spawner.spawned) == n)
            assert m.state == RUNNING and m.pid == spawner.spawned[-1].pid
            spawner.spawned[-1].exit(1)
        await until(lambda: len(spawner.spawned) == 5)
        assert clock.sleeps == [1, 2, 4, 4]
        assert m.restarts == 4
        assert m.last_exit_code == 1
        assert spawner.spawned[0].argv == LAUNCH.argv
        await m.stop(0.1)

    asyncio.run(scenario())


def test_backoff_resets_after_a_stable_run():
    async def scenario():
        spawner, clock = FakeSpawner(), RecordingClock()
        m = managed(spawner, clock, backoff_initial_s=1, stable_after_s=0)
        m.start()
        for n in range(1, 4):
            await until(lambda n=n: len(spawner.spawned) == n)
            spawner.spawned[-1].exit(1)
        await until(lambda: len(spawner.spawned) == 4)
        assert clock.sleeps == [1, 1, 1]
        await m.stop(0.1)

    asyncio.run(scenario())


def test_a_port_taken_by_someone_else_is_never_fought_over():
    async def scenario():
        spawner = FakeSpawner()
        taken = {"yes": True}
        m = managed(spawner, in_use=lambda: taken["yes"])
        m.start()
        await until(lambda: m.state == CONFLICT)
        assert spawner.spawned == []
        assert "already in use" in m.describe()["lastError"]
        taken["yes"] = False
        await until(lambda: m.state == RUNNING)
        await m.stop(0.1)

    asyncio.run(scenario())


def test_spawn_failures_back_off_and_retry():
    async def scenario():
        spawner = FakeSpawner(fail_with=FileNotFoundError(2, "No such file", "engine"))
        m = managed(spawner)
        m.start()
        await until(lambda: m.state == BACKOFF)
        assert "spawn failed" in m.last_error
        spawner.fail_with = None
        await until(lambda: m.state == RUNNING)
        await m.stop(0.1)

    asyncio.run(scenario())


def test_stop_terminates_then_kills_a_server_that_ignores_sigterm():
    async def scenario():
        spawner = FakeSpawner(obeys_term=False)
        m = managed(spawner)
        m.start()
        await until(lambda: m.state == RUNNING)
        started = time.monotonic()
        await m.stop(0.2)
        assert 0.15 <= time.monotonic() - started < 1.0
        assert spawner.spawned[0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]
        assert m.state == STOPPED and m.pid is None

    asyncio.run(scenario())


def test_a_stop_during_a_spawn_still_stops_what_was_spawned():
    class SlowSpawner(FakeSpawner):
        async def spawn(self, argv, *, env, cwd=None):
            await asyncio.sleep(0.1)
            return await super().spawn(argv, env=env, cwd=cwd)

    async def scenario():
        spawner = SlowSpawner()
        m = managed(spawner)
        m.start()
        await asyncio.sleep(0.02)  # the spawn is in flight
        await asyncio.wait_for(m.stop(1.0), 3)
        assert spawner.spawned[0].returncode is not None
        assert m.state == STOPPED

    asyncio.run(scenario())


def test_secrets_in_argv_are_masked_in_logs():
    argv = [
        "vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--port", "1",
        "--token-delay-ms", "15", "--ssl-keyfile", "/k.pem",
    ]  # fmt: skip
    assert redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "1",
        "--token-delay-ms", "15", "--ssl-keyfile", "/k.pem",
    ]  # fmt: skip


# -- through the API ---------------------------------------------------------------------------


def config(engine: str, model_path: str = "/models/qwen.gguf") -> dict:
    return {
        "slots": [
            {
                "kind": "inference",
                "gpuIndex": 0,
                "models": [
                    {
                        "name": "qwen-small",
                        "port": 18001,
                        "profile": {"engine": engine, "modelPath": model_path},
                    }
                ],
            }
        ]
    }


def status_of(client) -> dict:
    return client.get("/v1/status").json()["slots"][0]["models"][0]


def test_llamacpp_standby_stops_the_server_and_wake_is_a_cold_start(api):
    spawner = FakeSpawner()
    under_test = api(
        config("llamacpp"), servers={18001: FakeServerState("qwen-small")}, spawner=spawner
    )
    with checked_client(under_test.app) as client:
        Poller(client).until(lambda: status_of(client)["sleeping"] is False)
        model = status_of(client)
        assert model["standby"]["mode"] == "stop"
        assert model["standby"]["wakeKind"] == "cold-start"
        assert spawner.spawned[0].argv[0] == "llama-server"
        assert client.post("/v1/vllm/sleep").status_code == 200
        assert spawner.spawned[0].signals[0] == signal.SIGTERM
        asleep = status_of(client)
        assert asleep["sleeping"] is True and asleep["process"]["state"] == "stopped"
        assert "fingerprint" not in asleep  # nothing running: unknown, so left out
        assert client.get("/v1/ready").status_code == 200
        assert client.post("/v1/vllm/wake").status_code == 200
        assert len(spawner.spawned) == 2
        awake = status_of(client)
        assert awake["sleeping"] is False and awake["fingerprint"].startswith("sha256:")


def test_sglang_state_is_remembered_for_the_process_it_was_set_on(api):
    spawner = FakeSpawner()
    servers = {18001: FakeServerState("qwen-small")}
    under_test = api(config("sglang", "Qwen/Qwen2.5-7B"), servers=servers, spawner=spawner)
    with checked_client(under_test.app) as client:
        Poller(client).until(lambda: status_of(client)["sleeping"] is False)
        assert client.post("/v1/vllm/sleep").status_code == 200
        assert servers[18001].calls[-1] == "POST /release_memory_occupation"
        assert status_of(client)["sleeping"] is True
        assert client.post("/v1/vllm/wake").status_code == 200
        assert servers[18001].calls[-1] == "POST /resume_memory_occupation"
        assert status_of(client)["sleeping"] is False


def test_sleeping_a_managed_server_that_is_not_running_fails_with_the_reason(api):
    spawner = FakeSpawner(fail_with=FileNotFoundError(2, "No such file", "vllm"))
    under_test = api(
        config("vllm", "Qwen/x"), servers={18001: FakeServerState("qwen-small")}, spawner=spawner
    )
    with checked_client(under_test.app) as client:
        Poller(client).until(lambda: status_of(client)["process"]["state"] == "backoff")
        response = client.post("/v1/vllm/sleep")
        assert response.status_code == 502
        assert "server is not running (state backoff)" in response.json()["error"]["message"]
        assert status_of(client)["sleeping"] is None


def test_leaving_the_app_stops_managed_servers(api):
    spawner = FakeSpawner()
    under_test = api(
        config("vllm", "Qwen/x"), servers={18001: FakeServerState("qwen-small")}, spawner=spawner
    )
    with checked_client(under_test.app) as client:
        Poller(client).until(lambda: len(spawner.spawned) == 1)
        launched = spawner.spawned[0]
        assert launched.argv[:3] == ("vllm", "serve", "Qwen/x")
        assert launched.env["VLLM_SERVER_DEV_MODE"] == "1"
        assert "HARU_SUPERVISOR_TOKEN" not in launched.env
    assert launched.signals[0] == signal.SIGTERM
    assert launched.returncode is not None


class Poller:
    """Poll through a TestClient until a condition holds."""

    def __init__(self, client, timeout: float = 3.0) -> None:
        self.client = client
        self.timeout = timeout

    def until(self, predicate) -> None:
        deadline = time.monotonic() + self.timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not met"
            time.sleep(0.01)


def checked_client(app) -> TestClient:
    """A test client that checks every answer against the wire contract's schemas."""
    client = TestClient(app)
    client.event_hooks = {"request": [], "response": [check_response]}
    return client
