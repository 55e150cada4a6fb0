"""Thin consumers: authenticate the socket, join the fleet's group, relay each message as JSON.

A socket sees only fleets its user may view (fleets/core/access.py): a fleet's socket is refused
(4403, audited as `access.denied`) without the view role on it, and the overview's socket joins
the all-fleets group only for a user who may view every fleet, else the groups of the fleets
the user may view when it connects (a role granted later shows on the next connect, which the
page makes on reload).

Handler names match the message type `fleets.services.broadcast` sends
(`fleet.event` -> fleet_event).
Nothing is computed here: the browser applies the state carried
by the message and re-fetches the server-rendered fragment for the rest.
"""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleets.core.access import AccessGrant, Role
from fleets.models import Fleet
from fleets.reads.access import principal_label, user_grant
from fleets.services import broadcast
from fleets.services.access import access_denied_record
from fleets.services.broadcast import ALL_FLEETS_GROUP, fleet_group

# Close codes in the application range (4000-4999), so the browser can tell "log in again"
# from "the fleet is gone" and stop retrying instead of hammering the server.
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


def _logged_in(user) -> bool:
    return bool(user and user.is_authenticated and user.is_active)


@database_sync_to_async
def _grant(user) -> AccessGrant:
    return user_grant(user)


@database_sync_to_async
def _fleet_id(slug: str) -> str | None:
    pk = Fleet.objects.filter(slug=slug).values_list("id", flat=True).first()
    return str(pk) if pk else None


@database_sync_to_async
def _refusal_record(user, fleet_id: str | None, grant: AccessGrant, what: str) -> None:
    access_denied_record(
        fleet_id=fleet_id,
        actor=f"live:{principal_label(user)}",
        surface="live",
        action=what,
        needed=Role.VIEW,
        held=grant.role(fleet_id) if fleet_id else Role.NONE,
    )


class Refused(Exception):
    """The socket may not open: close with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _RelayConsumer(AsyncJsonWebsocketConsumer):
    """Refuse sockets without a staff session; relay group messages verbatim."""

    groups_joined: list[str]

    async def connect(self):
        self.groups_joined = []
        user = self.scope.get("user")
        if not _logged_in(user):
            # Closing before accept rejects the handshake (HTTP 403 to the browser).
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        try:
            groups = await self.groups_to_join(user, await _grant(user))
        except Refused as refused:
            await self.close(code=refused.code)
            return
        # Broadcasts from plain threads (the in-process reconcile loop) are handed to this loop.
        broadcast.bind_loop(asyncio.get_running_loop())
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def groups_to_join(self, user, grant: AccessGrant) -> list[str]:
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

    async def groups_to_join(self, user, grant):
        slug = self.scope["url_route"]["kwargs"]["slug"]
        fleet_id = await _fleet_id(slug)
        if fleet_id is None and grant.sees_every_fleet:
            raise Refused(CLOSE_NOT_FOUND)
        if fleet_id is None or not grant.allows(fleet_id, Role.VIEW):
            await _refusal_record(user, fleet_id, grant, f"watch {slug}")
            raise Refused(CLOSE_FORBIDDEN)
        return [fleet_group(fleet_id)]


class OverviewConsumer(_RelayConsumer):
    """The overview page: every fleet the user may view (with the all-fleets group, those
    created after the socket opened too)."""

    async def groups_to_join(self, user, grant):
        visible = grant.visible_ids()
        if visible is None:
            return [ALL_FLEETS_GROUP]
        if not visible:
            await _refusal_record(user, None, grant, "watch the overview")
            raise Refused(CLOSE_FORBIDDEN)
        return [fleet_group(fleet_id) for fleet_id in sorted(visible)]
