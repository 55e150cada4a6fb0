"""The live layer: sockets only for users who may view the fleet, and exactly one message per
state change, carrying the new state, on the in-memory layer and on channels_redis against a
real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import Client

from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet, Operation
from fleets.services import broadcast
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_request, operation_start
from fleets.services.route_pointer import route_switch
from fleets.services.transitions import domain_transition

pytestmark = pytest.mark.django_db(transaction=True)

# After `flush` every message is in the channel layer; this only covers the consumer's own hop
# from the layer to the socket. Nothing here asserts how fast a message arrives.
QUIET_S = 0.2


def _headers(client: Client | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if client is not None:
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return headers


async def _login(django_user_model, username: str, *, staff: bool) -> Client:
    user = await sync_to_async(django_user_model.objects.create_user)(
        username, password="pw-1234567", is_staff=staff, is_superuser=staff
    )
    client = Client()
    await sync_to_async(client.force_login)(user)
    return client


def _communicator(path: str, client: Client | None) -> WebsocketCommunicator:
    from haru.asgi import application  # noqa: PLC0415 - builds the app (and gc.freeze()s) at import: only once Django is set up for the test

    return WebsocketCommunicator(application, path, headers=_headers(client))


async def _flushed() -> None:
    """Wait until the publisher handed every queued message to the layer (off the loop: the
    hand-offs it waits for run on this loop)."""
    assert await asyncio.to_thread(broadcast.flush, 10)


async def _drain(comm: WebsocketCommunicator) -> list[dict]:
    await _flushed()
    out = []
    while not await comm.receive_nothing(timeout=QUIET_S):
        out.append(await comm.receive_json_from())
    return out


@pytest.fixture
def demo(seeded_fleet) -> Fleet:
    # Seeding records events: let their messages go out before any test socket connects.
    assert broadcast.flush(10)
    return seeded_fleet


# ----------------------------------------------------------------------------------------------
# Who may connect
# ----------------------------------------------------------------------------------------------


async def test_anonymous_socket_is_refused(channel_layer, demo):
    comm = _communicator("/ws/fleets/demo/", None)
    connected, code = await comm.connect()
    assert not connected
    assert code == 4401


async def test_socket_of_a_user_without_a_role_is_refused(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "visitor", staff=False)
    connected, code = await _communicator("/ws/fleets/demo/", client).connect()
    assert (connected, code) == (False, 4403)


async def test_socket_for_an_unknown_fleet_is_refused(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "ops", staff=True)
    connected, code = await _communicator("/ws/fleets/nope/", client).connect()
    assert (connected, code) == (False, 4404)


async def test_a_logged_out_session_is_refused(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "ops", staff=True)
    headers_before = _headers(client)
    await sync_to_async(client.logout)()
    from haru.asgi import application  # noqa: PLC0415 - builds the app (and gc.freeze()s) at import: only once Django is set up for the test

    comm = WebsocketCommunicator(application, "/ws/fleets/demo/", headers=headers_before)
    connected, _ = await comm.connect()
    assert not connected


# ----------------------------------------------------------------------------------------------
# Exactly one message per state change, with the new state
# ----------------------------------------------------------------------------------------------


async def test_domain_state_change_sends_exactly_one_message_with_the_new_state(
    channel_layer, demo, django_user_model
):
    client = await _login(django_user_model, "ops", staff=True)
    comm = _communicator("/ws/fleets/demo/", client)
    connected, _ = await comm.connect()
    assert connected
    west = await sync_to_async(Domain.objects.get)(fleet=demo, slug="west")

    moved = await sync_to_async(domain_transition)(
        domain_id=west.id, to_state="degraded", reason="test"
    )

    assert moved
    messages = await _drain(comm)
    assert len(messages) == 1
    [message] = messages
    assert message["type"] == "fleet.event"
    assert message["event"]["kind"] == "domain.degraded"
    assert message["event"]["domainId"] == str(west.id)
    assert message["event"]["data"] == {"from": "ready", "to": "degraded", "reason": "test"}
    assert message["fleet"]["id"] == str(demo.id)
    assert message["fleet"]["routeRevision"] == 1
    await comm.disconnect()


async def test_route_switch_sends_one_message_with_the_new_pointer(
    channel_layer, demo, django_user_model
):
    client = await _login(django_user_model, "ops", staff=True)
    comm = _communicator("/ws/fleets/demo/", client)
    assert (await comm.connect())[0]
    east = await sync_to_async(Domain.objects.get)(fleet=demo, slug="east")
    west = await sync_to_async(Domain.objects.get)(fleet=demo, slug="west")

    result = await sync_to_async(operation_request)(
        fleet=demo, kind="promote", target_domain_id=west.id
    )
    await sync_to_async(operation_start)(operation_id=result.operation.id)
    setup = await _drain(comm)
    assert [m["event"]["kind"] for m in setup] == [
        "operation.requested.promote",
        "operation.started",
    ]
    assert setup[-1]["fleet"]["operation"]["currentStep"] == "stop_training"

    revision = await sync_to_async(route_switch)(
        fleet_id=demo.id,
        operation_id=result.operation.id,
        target_domain_id=west.id,
        expected_active_id=east.id,
        expected_revision=1,
    )

    assert revision == 2
    messages = await _drain(comm)
    assert len(messages) == 1
    state = messages[0]["fleet"]
    assert messages[0]["event"]["kind"] == "fleet.route.switched"
    assert (state["activeDomainId"], state["routeRevision"]) == (str(west.id), 2)
    assert state["operation"]["id"] == str(result.operation.id)
    await comm.disconnect()


async def test_change_made_on_a_plain_thread_reaches_the_socket(
    channel_layer, demo, django_user_model
):
    """The in-process reconcile loop commits on plain threads, not on asgiref's: the message
    must still reach the server loop's sockets, once."""

    client = await _login(django_user_model, "ops", staff=True)
    comm = _communicator("/ws/fleets/demo/", client)
    assert (await comm.connect())[0]
    west_id = await sync_to_async(lambda: Domain.objects.get(fleet=demo, slug="west").id)()

    def on_a_plain_thread():
        try:
            return domain_transition(domain_id=west_id, to_state="degraded")
        finally:
            connection.close()

    moved = await asyncio.get_running_loop().run_in_executor(None, on_a_plain_thread)

    assert moved
    messages = await _drain(comm)
    assert [m["event"]["kind"] for m in messages] == ["domain.degraded"]
    await comm.disconnect()


async def test_a_change_in_another_fleet_is_not_sent(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "ops", staff=True)
    other = await sync_to_async(_seed_other_fleet)()
    comm = _communicator("/ws/fleets/demo/", client)
    assert (await comm.connect())[0]
    west = await sync_to_async(Domain.objects.get)(fleet=other, slug="west")
    assert await sync_to_async(domain_transition)(domain_id=west.id, to_state="degraded")
    await _flushed()
    assert await comm.receive_nothing(timeout=QUIET_S)
    await comm.disconnect()


async def test_overview_socket_hears_every_fleet(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "ops", staff=True)
    other = await sync_to_async(_seed_other_fleet)()
    comm = _communicator("/ws/overview/", client)
    assert (await comm.connect())[0]
    for fleet in (demo, other):
        west = await sync_to_async(Domain.objects.get)(fleet=fleet, slug="west")
        assert await sync_to_async(domain_transition)(domain_id=west.id, to_state="degraded")
    messages = await _drain(comm)
    assert sorted(m["fleet"]["slug"] for m in messages) == ["demo", "other"]
    await comm.disconnect()


async def test_overview_socket_hears_a_fleet_created_after_it_connected(
    channel_layer, demo, django_user_model
):
    client = await _login(django_user_model, "ops", staff=True)
    comm = _communicator("/ws/overview/", client)
    assert (await comm.connect())[0]
    await sync_to_async(_seed_other_fleet)()
    messages = await _drain(comm)
    assert {m["fleet"]["slug"] for m in messages} == {"other"}
    assert "layout.applied" in {m["event"]["kind"] for m in messages}
    await comm.disconnect()


async def test_messages_from_the_browser_are_ignored(channel_layer, demo, django_user_model):
    client = await _login(django_user_model, "ops", staff=True)
    comm = _communicator("/ws/fleets/demo/", client)
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "fleet.event", "promote": "west"})
    await comm.send_to(text_data="{not json")
    assert await comm.receive_nothing(timeout=QUIET_S)
    assert not await sync_to_async(_any_operation)()
    await comm.disconnect()


def _any_operation() -> bool:
    return Operation.objects.exists()


def _seed_other_fleet() -> Fleet:
    """Apply the example layout a second time under another slug."""

    path = Path(__file__).resolve().parents[2] / "examples" / "fleet.two-domain.json"
    data = {**json.loads(path.read_text()), "slug": "other"}
    layout_apply(layout=parse_layout(data))
    assert broadcast.flush(10)  # the seeding's own messages are not what the tests count
    return Fleet.objects.get(slug="other")
