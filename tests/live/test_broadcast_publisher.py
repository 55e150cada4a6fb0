"""The broadcast publisher: commit hooks only read the state and queue, one thread sends in
commit order, a wedged layer drops the oldest message instead of blocking anyone, and the
thread's database reads hold no transaction."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections

from fleets.models import Domain
from fleets.services import broadcast
from fleets.services.operations import (
    operation_fail,
    operation_request,
    operation_start,
    operation_step_done,
)
from fleets.services.transitions import domain_transition

pytestmark = pytest.mark.django_db(transaction=True)

# After `flush` every message is in the layer: this only bounds the wait for "no more".
QUIET_S = 0.2


@pytest.fixture
def layer(channel_layer):
    """The layer under test (see conftest: in-memory, then channels_redis)."""
    return channel_layer


@pytest.fixture
def no_server_loop(monkeypatch):
    """A Celery worker or a management command: no ASGI server loop to hand sends to."""
    monkeypatch.setattr(broadcast.publisher(), "server_loop", None)


@pytest.fixture
def demo(seeded_fleet):
    assert broadcast.flush(10)  # the seeding's own messages are not what the tests count
    return seeded_fleet


def _listen(layer, fleet_id) -> str:
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(broadcast.fleet_group(fleet_id), channel)
    return channel


def _received(layer, channel: str) -> list[dict]:
    """Return every message waiting on `channel` (call after `flush`: they are all there)."""

    async def take() -> list[dict]:
        out = []
        while True:
            try:
                out.append(await asyncio.wait_for(layer.receive(channel), QUIET_S))
            except TimeoutError:
                return out

    return async_to_sync(take)()


@pytest.fixture
def wedged(monkeypatch):
    """Hold every send until the returned gate opens (a slow layer, a busy publisher); record
    the kinds of the events sent."""
    gate = threading.Event()
    gate.sent = []
    real_send = broadcast._send

    def held(fleet_id, message):
        gate.wait(10)
        gate.sent.append(message.get("event", {}).get("kind"))
        real_send(fleet_id, message)

    monkeypatch.setattr(broadcast, "_send", held)
    yield gate
    gate.set()


def test_commit_hook_only_queues_while_the_layer_is_wedged(demo, wedged, no_server_loop):
    west = Domain.objects.get(fleet=demo, slug="west")
    started = time.perf_counter()
    assert domain_transition(domain_id=west.id, to_state="degraded", reason="test")
    assert domain_transition(domain_id=west.id, to_state="ready", reason="test")
    elapsed = time.perf_counter() - started
    # Two commits, each with a send that cannot finish (for up to 10 s): neither waited for it.
    assert elapsed < 1.0
    assert wedged.sent == []
    wedged.set()
    assert broadcast.flush(10)
    assert wedged.sent == ["domain.degraded", "domain.ready"]


def test_messages_leave_in_commit_order_one_per_change(demo, layer, no_server_loop):
    west = Domain.objects.get(fleet=demo, slug="west")
    channel = _listen(layer, demo.id)
    path = ["degraded", "ready", "degraded", "failed", "degraded", "ready"]
    for to_state in path:
        assert domain_transition(domain_id=west.id, to_state=to_state, reason="order")
    assert broadcast.flush(10)

    messages = _received(layer, channel)
    assert [m["event"]["kind"] for m in messages] == [f"domain.{s}" for s in path]
    assert [m["event"]["data"]["to"] for m in messages] == path
    ids = [m["event"]["id"] for m in messages]
    assert ids == sorted(ids)
    assert all(m["fleet"]["id"] == str(demo.id) for m in messages)


def test_each_message_carries_the_state_right_after_its_own_commit(
    demo, layer, no_server_loop, wedged
):
    """A tick commits steps faster than any publisher sends: each message must still show the
    step its own change led to, or the dashboard skips the short ones (switch_route)."""
    west = Domain.objects.get(fleet=demo, slug="west")
    channel = _listen(layer, demo.id)
    op = operation_request(fleet=demo, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    for step in ("stop_training", "verify_gpu", "wake"):
        assert operation_step_done(operation_id=op.id, step=step)
    assert operation_fail(operation_id=op.id, step="probe", code="probe_failed", message="boom")
    wedged.set()  # only now does anything go out
    assert broadcast.flush(10)

    messages = _received(layer, channel)
    seen = [
        (m["event"]["kind"], m["event"]["step"] or None, m["fleet"]["operation"]["currentStep"])
        for m in messages
    ]
    assert seen == [
        ("operation.requested.promote", None, None),
        ("operation.started", "stop_training", "stop_training"),
        ("operation.step.done", "stop_training", "verify_gpu"),
        ("operation.step.done", "verify_gpu", "wake"),
        ("operation.step.done", "wake", "probe"),
        ("operation.failed", "probe", "probe"),
    ]
    last = messages[-1]["fleet"]["operation"]
    assert (last["state"], last["error"]["code"]) == ("failed", "probe_failed")
    assert last["stepStartedAt"].endswith("Z")


def test_a_full_queue_drops_the_oldest_and_never_blocks_the_caller():
    publisher = broadcast.Publisher(limit=3)
    gate = threading.Event()
    ran: list[str] = []
    dropped_before = broadcast.DROPPED._value.get()

    publisher.submit(lambda: gate.wait(10))  # wedged: holds the thread
    deadline = time.monotonic() + 5
    while publisher._jobs and time.monotonic() < deadline:
        time.sleep(0.005)  # until the thread took the wedged job off the queue
    started = time.perf_counter()
    for name in "abcde":
        publisher.submit(lambda n=name: ran.append(n))
    assert time.perf_counter() - started < 0.1
    assert publisher.dropped == 2
    assert broadcast.DROPPED._value.get() == dropped_before + 2

    gate.set()
    assert publisher.flush(5)
    assert ran == ["c", "d", "e"]  # the newest survive, in order


def test_the_thread_starts_lazily_as_a_daemon_and_survives_a_failing_job():
    publisher = broadcast.Publisher()
    assert publisher._thread is None
    ran = []

    def boom():
        raise RuntimeError("boom")

    publisher.submit(boom)
    publisher.submit(lambda: ran.append(threading.current_thread()))
    assert publisher.flush(5)
    [thread] = ran
    assert thread is publisher._thread
    assert thread.daemon and thread.name == "haru-broadcast"


def test_flush_times_out_instead_of_hanging():
    publisher = broadcast.Publisher()
    gate = threading.Event()
    publisher.submit(lambda: gate.wait(10))
    try:
        assert publisher.flush(0.05) is False
    finally:
        gate.set()
    assert publisher.flush(5)


def test_state_reads_on_the_publisher_thread_hold_no_transaction(demo):
    seen = {}

    def job():
        seen["state"] = broadcast.fleet_state(demo.id)
        seen["atomic"] = connection.in_atomic_block
        seen["autocommit"] = connection.get_autocommit()
        seen["thread"] = threading.current_thread().name

    broadcast.publisher().submit(job)
    assert broadcast.flush(10)
    assert seen["state"]["slug"] == "demo"
    assert (seen["atomic"], seen["autocommit"], seen["thread"]) == (False, True, "haru-broadcast")


def test_an_idle_publisher_gives_its_connection_back(demo):
    if connections["default"].vendor == "sqlite" and connections["default"].is_in_memory_db():
        pytest.skip("Django never closes the in-memory test database's connections")
    publisher = broadcast.Publisher(idle_close_s=0.05)
    opened = {}

    def read():
        broadcast.fleet_state(demo.id)
        opened["conn"] = connections["default"]  # this thread's own connection

    publisher.submit(read)
    assert publisher.flush(5)
    assert opened["conn"].connection is not None
    deadline = time.monotonic() + 5
    while opened["conn"].connection is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert opened["conn"].connection is None


def test_a_messages_state_is_one_read_so_its_parts_are_of_one_moment(
    demo, django_assert_num_queries
):
    """The header (pointer, revision) and the operation a message carries are read by one
    statement: the page applies them together, so they must be of the same commit."""
    west = Domain.objects.get(fleet=demo, slug="west")
    op = operation_request(fleet=demo, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    with django_assert_num_queries(1):
        state = broadcast.fleet_state(demo.id, op.id)
    assert state is not None
    assert state["routeRevision"] == demo.route_revision
    assert state["operation"]["currentStep"] == "stop_training"
