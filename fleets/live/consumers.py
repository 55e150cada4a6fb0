"""Thin consumers: authenticate the socket, join the fleet's group, relay each message as JSON.

Handler names match the message type `fleets.services.broadcast` sends
(`fleet.event` -> fleet_event).
Nothing is computed here: the browser applies the state carried
by the message and re-fetches the server-rendered fragment for the rest.
"""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleets.models import Fleet
from fleets.services import broadcast
from fleets.services.broadcast import ALL_FLEETS_GROUP, fleet_group

# Close codes in the application range (4000-4999), so the browser can tell "log in again"
# from "the fleet is gone" and stop retrying instead of hammering the server.
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404


def _is_staff(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


@database_sync_to_async
def _fleet_id(slug: str) -> str | None:
    pk = Fleet.objects.filter(slug=slug).values_list("id", flat=True).first()
    return str(pk) if pk else None


class _RelayConsumer(AsyncJsonWebsocketConsumer):
    """Refuse sockets without a staff session; relay group messages verbatim."""

    groups_joined: list[str]

    async def connect(self):
        self.groups_joined = []
        if not _is_staff(self.scope.get("user")):
            # Closing before accept rejects the handshake (HTTP 403 to the browser).
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        groups = await self.groups_to_join()
        if groups is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        # Broadcasts from plain threads (the in-process reconcile loop) are handed to this loop.
        broadcast.bind_loop(asyncio.get_running_loop())
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def groups_to_join(self) -> list[str] | None:
        raise NotImplementedError

    async def disconnect(self, code):
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        # The socket is one-way: actions go through CSRF-protected POSTs, never over here, and
        # whatever a browser sends (malformed JSON included) is ignored, not parsed.
        return

    async def fleet_event(self, message):
        await self.send_json(
            {"type": "fleet.event", "fleet": message.get("fleet"), "event": message.get("event")}
        )


class FleetConsumer(_RelayConsumer):
    """One fleet's page: `ws/fleets/<slug>/`."""

    async def groups_to_join(self):
        fleet_id = await _fleet_id(self.scope["url_route"]["kwargs"]["slug"])
        return [fleet_group(fleet_id)] if fleet_id else None


class OverviewConsumer(_RelayConsumer):
    """The overview page: every fleet, including those created after the socket opened."""

    async def groups_to_join(self):
        return [ALL_FLEETS_GROUP]
