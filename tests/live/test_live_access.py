"""Per-fleet access on the live sockets: a user watches only the fleets it may view. A fleet's
socket without the view role is refused (4403) and audited; the overview's socket of a user who
may view one fleet hears that fleet and not the others."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from fleets.core.access import Role
from fleets.models import Domain, Fleet
from fleets.services import broadcast
from fleets.services.access import fleet_role_set
from fleets.services.transitions import domain_transition
from tests.access_fixtures import denials
from tests.live.test_live_consumers import _communicator, _drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("denials_forgotten")]


@pytest.fixture
def two_fleets(seeded_fleet, other_fleet) -> tuple[Fleet, Fleet]:
    assert broadcast.flush(10)  # seeding's messages are out before a socket connects
    return seeded_fleet, other_fleet


def _viewer_of(django_user_model, fleet: Fleet) -> Client:
    user = django_user_model.objects.create_user("watcher", password="pw-0123456789")
    fleet_role_set(holder=user, role=Role.VIEW, fleet=fleet)
    client = Client()
    client.force_login(user)
    return client


async def test_a_fleet_socket_without_the_view_role_is_refused_and_audited(
    channel_layer, two_fleets, django_user_model
):
    demo, other = two_fleets
    client = await sync_to_async(_viewer_of)(django_user_model, demo)
    own = _communicator("/ws/fleets/demo/", client)
    assert (await own.connect())[0]
    await own.disconnect()

    connected, code = await _communicator("/ws/fleets/other/", client).connect()

    assert (connected, code) == (False, 4403)
    (event,) = await sync_to_async(denials)(other)
    assert (event.actor, event.data["surface"]) == ("live:watcher", "live")
    # A missing fleet is refused the same way: a viewer of one fleet cannot map the others.
    assert (await _communicator("/ws/fleets/nope/", client).connect()) == (False, 4403)


async def test_the_overview_socket_hears_only_the_fleets_the_user_may_view(
    channel_layer, two_fleets, django_user_model
):
    demo, other = two_fleets
    client = await sync_to_async(_viewer_of)(django_user_model, demo)
    comm = _communicator("/ws/overview/", client)
    assert (await comm.connect())[0]
    for fleet in (demo, other):
        west = await sync_to_async(Domain.objects.get)(fleet=fleet, slug="west")
        assert await sync_to_async(domain_transition)(domain_id=west.id, to_state="degraded")
    messages = await _drain(comm)
    assert [m["fleet"]["slug"] for m in messages] == ["demo"]
    await comm.disconnect()
