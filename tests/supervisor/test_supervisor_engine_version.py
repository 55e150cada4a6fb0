"""The status reports each model server's engine version (`GET /version`), read in the
background: once per server process, again after a while for a server the supervisor did not
start, and never inside the status call itself."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx

from supervisor import model_servers
from tests.supervisor.fakes import FakeModelServers, FakeServerState
from tests.supervisor.test_supervisor_api import CONFIG, checked_client, models_of, servers


class ManualClock:
    """Monotonic time that moves only when told; sleeps only yield."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


def _version_reads(state: FakeServerState) -> int:
    return state.calls.count("GET /version")


def _poll_status(client, model: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        entry = models_of(client.get("/v1/status").json())[model]
        if "engineVersion" in entry or time.monotonic() > deadline:
            return entry
        time.sleep(0.02)


def test_the_status_reports_the_engine_version_once_read_even_while_asleep(api):
    state = servers(p18001={"version": "0.11.2", "sleeping": True})
    under_test = api(CONFIG, servers=state)
    with checked_client(under_test.app) as client:
        first = models_of(client.get("/v1/status").json())["qwen-small"]
        # The first status never waits for the read: the version shows in a later one.
        assert "engineVersion" not in first
        entry = _poll_status(client, "qwen-small")
        assert entry["engineVersion"] == "0.11.2" and entry["sleeping"] is True
        for _ in range(5):
            client.get("/v1/status")
    # One read for the process, however many statuses follow (within the recheck interval).
    assert _version_reads(state[18001]) == 1
    # An engine that does not say is left out, never null, and not asked on every status.
    llama = models_of(client.get("/v1/status").json())["llama-small"]
    assert "engineVersion" not in llama
    assert _version_reads(state[18002]) == 1


def test_a_server_still_starting_is_asked_for_its_version_once_it_answers(api):
    state = servers(p18001={"version": "0.11.2", "reachable": False})
    under_test = api(CONFIG, servers=state)
    with checked_client(under_test.app) as client:
        for _ in range(3):
            entry = models_of(client.get("/v1/status").json())["qwen-small"]
            assert entry["sleeping"] is None and "engineVersion" not in entry
        state[18001].reachable = True
        # Not asked while it refused: a refused read would have stood for "this engine gives
        # no version" until the retry interval (30 s), far past this wait.
        assert _poll_status(client, "qwen-small")["engineVersion"] == "0.11.2"


def _server(under_test, name: str):
    return next(m for m in under_test.host.models if m.name == name)


def test_an_unmanaged_server_is_asked_again_after_the_recheck_interval(api):
    state = servers(p18001={"version": "0.11.2"})
    under_test = api(CONFIG, servers=state)
    server = _server(under_test, "qwen-small")
    clock = ManualClock()
    server._clock = clock

    async def scenario() -> list[str | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(under_test.servers)) as http:
            seen = [server.engine_version(http)]
            await asyncio.sleep(0.05)
            seen.append(server.engine_version(http))
            # Upgraded in place (same port; the supervisor did not start it, so no pid tells).
            state[18001].version = "0.12.0"
            clock.now += model_servers.VERSION_RECHECK_S - 1
            seen.append(server.engine_version(http))
            await asyncio.sleep(0.05)
            clock.now += 1
            seen.append(server.engine_version(http))  # due: the old one until the read is in
            await asyncio.sleep(0.05)
            seen.append(server.engine_version(http))
            return seen

    assert asyncio.run(scenario()) == [None, "0.11.2", "0.11.2", "0.11.2", "0.12.0"]
    assert _version_reads(state[18001]) == 2


def test_an_engine_that_gave_no_version_is_asked_again_sooner(api):
    state = servers()
    under_test = api(CONFIG, servers=state)
    server = _server(under_test, "qwen-small")
    clock = ManualClock()
    server._clock = clock

    async def scenario() -> list[str | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(under_test.servers)) as http:
            seen = [server.engine_version(http)]
            await asyncio.sleep(0.05)
            clock.now += model_servers.VERSION_RETRY_S - 1
            seen.append(server.engine_version(http))
            await asyncio.sleep(0.05)
            state[18001].version = "0.11.2"  # came up late
            clock.now += 1
            server.engine_version(http)
            await asyncio.sleep(0.05)
            seen.append(server.engine_version(http))
            return seen

    assert asyncio.run(scenario()) == [None, None, "0.11.2"]
    assert _version_reads(state[18001]) == 2


def test_a_managed_servers_version_belongs_to_the_process_it_was_read_from(api):
    state = servers(p18001={"version": "0.11.2"})
    under_test = api(CONFIG, servers=state)
    server = _server(under_test, "qwen-small")
    process = SimpleNamespace(running=True, pid=4242)
    server.managed = process
    server._clock = ManualClock()

    async def scenario() -> list[str | None]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(under_test.servers)) as http:
            server.engine_version(http)
            await asyncio.sleep(0.05)
            seen = [server.engine_version(http)]
            server._clock.now += 10 * model_servers.VERSION_RECHECK_S
            seen.append(server.engine_version(http))  # one read per process: never again
            # Restarted on a new engine: the old process's version is not this one's.
            state[18001].version = "0.12.0"
            process.pid = 4243
            seen.append(server.engine_version(http))
            await asyncio.sleep(0.05)
            seen.append(server.engine_version(http))
            process.running = False
            seen.append(server.engine_version(http))  # nothing running: nothing to say
            return seen

    assert asyncio.run(scenario()) == ["0.11.2", "0.11.2", None, "0.12.0", None]
    assert _version_reads(state[18001]) == 2


def test_the_servers_own_fake_answers_404_without_a_version():
    # Guards the scenario above: the scripted server really is silent without a version.
    handler = FakeModelServers({18001: FakeServerState("qwen-small")})

    async def ask() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return (await http.get("http://127.0.0.1:18001/version")).status_code

    assert asyncio.run(ask()) == 404
