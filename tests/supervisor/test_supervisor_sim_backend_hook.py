"""Where the simulated engine calls its memory backend, without torch: a recording backend.

The torch tier proves the real backend moves bytes; this proves the engine calls it at the
right points of vLLM's contract (after the drain, with only the tags still asleep, never for
level 0), so the default suite catches a merge or refactor that drops a call.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.testclient import TestClient

from supervisor.sim.engine import SimEngine, SimOptions, build_app


class RecordingBackend:
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def allocate(self) -> None:
        self.calls.append(("allocate",))

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake(self, tags: frozenset[str]) -> None:
        self.calls.append(("wake", tags))

    def describe(self, *, checksum: bool = False) -> dict[str, Any]:
        return {"backend": self.name, "checksum": checksum}

    def close(self) -> None:
        self.calls.append(("close",))


def serve(backend: RecordingBackend | None, **options: Any) -> TestClient:
    engine = SimEngine(SimOptions(model="m", port=1, **options), None, backend)
    # From loopback: the simulator's /_sim routes are local-only.
    return TestClient(build_app(engine), client=("127.0.0.1", 50000))


def wait_loaded(client: TestClient) -> None:
    for _ in range(200):
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError("the engine never loaded its backend")


def test_a_standby_allocates_then_sleeps_and_wakes_tag_by_tag_then_closes():
    backend = RecordingBackend()
    with serve(backend, start_asleep=True) as client:
        wait_loaded(client)
        assert backend.calls == [("allocate",), ("sleep", 1)]
        client.post("/wake_up", params={"tags": "weights"})
        client.post("/wake_up", params={"tags": "weights"})  # already back: moves nothing
        assert client.post("/wake_up").json() == {"status": "awake", "tags": None}
    assert backend.calls[2:] == [
        ("wake", frozenset({"weights"})),
        ("wake", frozenset({"kv_cache"})),
        ("close",),
    ]


def test_level_zero_only_pauses_and_leaves_the_backends_memory_alone():
    backend = RecordingBackend()
    with serve(backend) as client:
        wait_loaded(client)
        assert client.post("/sleep", params={"level": "0"}).json()["status"] == "sleeping"
        client.post("/wake_up")
        client.post("/sleep", params={"level": "2"})
        client.post("/wake_up")
    assert backend.calls == [
        ("allocate",),
        ("sleep", 2),
        ("wake", frozenset({"weights", "kv_cache"})),
        ("close",),
    ]


async def test_the_backend_sleeps_only_after_running_requests_drain():
    backend = RecordingBackend()
    engine = SimEngine(SimOptions(model="m", port=1), None, backend)
    engine.generation_started()
    sleeping = asyncio.create_task(engine.sleep(1, mode="wait"))
    await asyncio.sleep(0.05)
    assert backend.calls == [] and not engine.sleeping
    engine.generation_ended()
    await sleeping
    assert backend.calls == [("sleep", 1)] and engine.sleeping


def test_the_backend_route_reports_its_facts_or_404_without_one():
    with serve(RecordingBackend()) as client:
        wait_loaded(client)
        assert client.get("/_sim/backend", params={"checksum": "1"}).json() == {
            "backend": "recording",
            "checksum": True,
        }
    with serve(None) as client:
        assert client.get("/_sim/backend").status_code == 404
