"""A request for an adapter's name: which version answers, and the answer under the asked name.

Clients ask for `support-bot`; the engine serves each version under its concrete name
(`support-bot@v7`, fleets/core/adapter_route.py). A request whose `model` no binding of the
active domain serves but the fleet's adapter routes name is sent to the active's binding of the
route's base model (the same server, with everything the base model's path does: hold,
continuation, drain, fail-open; fleets/proxy/handler.py), with `model` rewritten to the chosen
version's engine name. Its answer goes back under the name the client asked for: `model` in the
JSON body and in every SSE chunk that carries it, and `x-haru-adapter-version` names the version
that answered (the first response's: a stream continued after a cut keeps that header).

Only a version whose copy on the serving domain is `probed` is routable (fleets/core/adapters.py):
the other version of the route takes a request whose chosen version is not probed there, and
with neither probed the request is refused `adapter_not_ready` before anything is sent, never
answered by the base model. docs/adapter-routing.md says the same for operators.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from django.db.models import Q

from common.wire import bounded_json
from fleets.base.conf import haru_settings
from fleets.core.adapter_route import AdapterRoute, choose_version, concrete_name
from fleets.core.arm_stats import Arm
from fleets.models import AdapterVersion
from fleets.proxy import errors
from fleets.proxy.split import sticky_key

if TYPE_CHECKING:
    import asyncio

    from fleets.proxy.plan import Plan
    from fleets.proxy.snapshots import Route, Snapshot

log = logging.getLogger("haru.proxy")

VERSION_HEADER = b"x-haru-adapter-version"
Headers = list[tuple[bytes, bytes]]
_NONE: frozenset[str] = frozenset()


class AdapterPick:
    """One request's adapter: the name asked, the version drawn, the version last sent."""

    __slots__ = ("name", "fleet_id", "drawn", "version", "engine", "bodies")

    def __init__(self, name: str, fleet_id: str) -> None:
        self.name = name
        self.fleet_id = fleet_id
        self.drawn: int | None = None  # the version its stickiness key (or one draw) chose
        self.version = 0  # the version it was last sent to, and its engine name
        self.engine = ""
        self.bodies: dict[str, bytes] = {}  # engine name -> the request body naming it


def route(
    snapshot: Snapshot,
    name: str,
    adapter: AdapterRoute,
    headers: dict[bytes, bytes],
    exchange,
    plan: Plan | None,
    body: bytes,
) -> tuple[Route, bytes]:
    """The route (the active's binding of the base model) and the body to send a request for
    adapter `name` with; sets the request's arm when the route has a rollout in flight.

    Raises adapter_not_ready when no version of the route is probed on the active domain,
    no_active_domain, and model_unavailable (held, as for the base model) while the base model
    is bound but cannot take traffic.
    """
    if snapshot.active_domain_id is None:
        raise errors.no_active_domain(f"fleet {snapshot.fleet_slug} has no active domain")
    pick = exchange.adapter
    if pick is None or pick.name != name:
        pick = exchange.adapter = AdapterPick(name, snapshot.fleet_id)
    if pick.drawn is None or pick.drawn not in adapter.versions():
        # Drawn once per request: a held or continued request keeps its version (a keyed one
        # would draw the same again; one without a key must not flip between its sends).
        pick.drawn, _ = choose_version(adapter, sticky_key(adapter, headers))
    version = pick.drawn
    if exchange.avoid_candidate and version == adapter.candidate:
        version = adapter.version  # the candidate failed this request: the stable, once
    probed = snapshot.probed.get(snapshot.active_domain_id, _NONE)
    if concrete_name(name, version) not in probed:
        other = adapter.candidate if version == adapter.version else adapter.version
        if other is None or concrete_name(name, other) not in probed:
            raise errors.adapter_not_ready(
                f"adapter {name!r} has no version ready on domain "
                f"{snapshot.active_domain_slug} yet (loaded and probed); retry"
            )
        version = other
    base = snapshot.routes.get(adapter.base)
    if base is None:
        if adapter.base in snapshot.unavailable:
            raise errors.model_unavailable(
                f"adapter {name!r}'s base model {adapter.base!r} cannot take traffic now "
                f"({snapshot.unavailable[adapter.base]}); retry"
            )
        raise errors.adapter_not_ready(
            f"adapter {name!r}'s base model {adapter.base!r} is not served by domain "
            f"{snapshot.active_domain_slug}"
        )
    if adapter.candidate is not None and adapter.rollout_id:
        # The arm of the version that answers: a request whose drawn version was not probed
        # is counted where it was served, never as an error of the arm it was drawn for.
        exchange.arm = Arm.CANDIDATE if version == adapter.candidate else Arm.STABLE
        exchange.rollout = adapter.rollout_id
    engine = concrete_name(name, version)
    pick.version, pick.engine = version, engine
    if plan is None:  # a continuation's own body (small): rewritten each time
        return base, _renamed(_document(body), engine)
    sent = pick.bodies.get(engine)
    if sent is None:
        sent = pick.bodies[engine] = _renamed(plan.document, engine)
    return base, sent


def _document(body: bytes) -> dict:
    return bounded_json.loads(body, max_depth=haru_settings().json_max_depth)


def _renamed(document: dict, engine: str) -> bytes:
    # Re-serialized rather than patched in place: `model` may be spelled with escapes, and
    # only the parsed document says where it is. ASCII-escaped: a lone surrogate the client
    # sent stays valid JSON.
    return json.dumps({**document, "model": engine}, separators=(",", ":")).encode()


class Renamer:
    """Rewrites `"model":"NAME@vN"` back to `"model":"NAME"` in an answer's bytes as they go.

    Only bytes that carry the engine name are searched with the pattern; an upstream read that
    ends inside a `"model"` field (never at an SSE event's end) keeps that bounded tail back
    until the next read or the end.
    """

    __slots__ = ("name", "marker", "pattern", "replacement", "heads", "limit", "tail")

    def __init__(self, name: str) -> None:
        raw = name.encode()
        self.name = raw
        self.marker = raw + b"@v"
        self.pattern = re.compile(rb'("model"\s?:\s?")' + re.escape(raw) + rb'@v[0-9]{1,10}"')
        # An adapter name is [a-z0-9._-]: nothing in it reads as a template escape.
        self.replacement = rb"\g<1>" + raw + b'"'
        self.heads = (b'"model":"' + self.marker, b'"model": "' + self.marker)
        self.limit = len(self.heads[1]) + 11  # the longest field: head, ten digits, quote
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.tail + chunk if self.tail else chunk
        self.tail = b""
        if self.marker in data:
            data = self.pattern.sub(self.replacement, data)
        if data.endswith(b"\n") or b'"' not in data[-self.limit :]:
            return data  # an SSE event's end, or no field can have begun: nothing held
        cut = self._partial(data)
        if cut is None:
            return data
        self.tail = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail

    def _partial(self, data: bytes) -> int | None:
        """Where an unfinished `"model":"NAME@vN` begins in the last bytes, or None."""
        start = max(0, len(data) - self.limit)
        at = data.find(b'"', start)
        while at != -1:
            rest = data[at:]
            for head in self.heads:
                if head.startswith(rest) or (rest.startswith(head) and rest[len(head) :].isdigit()):
                    return at
            at = data.find(b'"', at + 1)
        return None


class ClientIO(Protocol):
    """fleets/proxy/flow.py's ClientIO, declared here (as continuation.py does) so that this
    module, which flow and handler import, needs neither."""

    gone: bool

    async def read_body(self, limit: int) -> bytes | None: ...
    def watch(self) -> asyncio.Task: ...
    def unwatch(self) -> None: ...
    async def respond(self, status: int, headers: Headers, body: bytes, *, more: bool) -> None: ...
    async def write(self, chunk: bytes) -> None: ...
    async def end(self) -> None: ...
    def abort(self) -> None: ...


class AnswerIO:
    """A client connection whose answer names the adapter asked for (wraps flow.ClientIO)."""

    __slots__ = ("io", "renamer")

    def __init__(self, io: ClientIO, renamer: Renamer) -> None:
        self.io = io
        self.renamer = renamer

    @property
    def gone(self) -> bool:
        return self.io.gone

    @gone.setter
    def gone(self, value: bool) -> None:
        self.io.gone = value

    async def read_body(self, limit: int) -> bytes | None:
        return await self.io.read_body(limit)

    def watch(self) -> asyncio.Task:
        return self.io.watch()

    def unwatch(self) -> None:
        self.io.unwatch()

    async def respond(self, status: int, headers: Headers, body: bytes, *, more: bool) -> None:
        body = self.renamer.feed(body)
        if not more:
            body += self.renamer.flush()
        # The body's length changes: a complete one says its new length, a streamed one none.
        out = [(n, v) for n, v in headers if n != b"content-length"]
        if not more:
            out.append((b"content-length", b"%d" % len(body)))
        await self.io.respond(status, out, body, more=more)

    async def write(self, chunk: bytes) -> None:
        out = self.renamer.feed(chunk)
        if out:
            await self.io.write(out)

    async def end(self) -> None:
        tail = self.renamer.flush()
        if tail:
            await self.io.write(tail)
        await self.io.end()

    def abort(self) -> None:
        self.io.abort()


def answering(io: ClientIO, headers: Headers, pick: AdapterPick) -> tuple[ClientIO, Headers]:
    """The connection and headers of an adapter's answer: renamed, and naming the version that
    answered it first."""
    headers = [*headers, (VERSION_HEADER, pick.engine.encode())]
    return AnswerIO(io, Renamer(pick.name)), headers


# -- Freshness: when a version first served a user token (written by the proxy's background
# writer, fleets/proxy/arm_stats.py, never on the request path).

Served = tuple[str, str, int]  # fleet id, adapter name, version


def first_served_write(marks: Iterable[tuple[Served, datetime]]) -> int:
    """Set `first_served_at` of each version not marked yet; return the rows moved.

    One conditional UPDATE per version: `first_served_at IS NULL` is the compare-and-swap, so
    every proxy process may report a version and only the earliest write lands.
    """
    moved = 0
    for (fleet_id, name, version), at in marks:
        moved += AdapterVersion.objects.filter(
            Q(first_served_at__isnull=True), fleet_id=fleet_id, name=name, version=version
        ).update(first_served_at=at)
    return moved
