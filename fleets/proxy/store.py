"""The proxy's two reads of the state store, run on one dedicated database thread.

Why one thread of our own, not `sync_to_async`: Django connections are per thread, and a
dedicated thread keeps exactly one persistent connection per server process, outside the
PostgreSQL pool the rest of the server borrows from (no request
signals run on the lean ASGI path to open and close them), costs one cheap executor hop per
read, and lets tests reach that connection to take it down. An indexed read takes well under a
millisecond, so one thread carries thousands of requests per second.

Both reads raise `StoreUnreachable` when the store cannot be asked (connection refused, dropped,
timed out) and `StoreUnusable` when it answered but not with usable state.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from fleets.base.private_apis import unpooled
from fleets.core.adapter_route import MAX_ADAPTER_ROUTES
from fleets.core.adapters import AdapterVersionState, CopyState
from fleets.core.continuation import engine_of
from fleets.core.model_health import ServerHealth
from fleets.core.route_split import MAX_SPLITS
from fleets.models import AdapterCopy, Domain, Fleet, ModelBinding

T = TypeVar("T")


def own_connection() -> None:
    """Give the database thread a connection of its own, outside the server's pool.

    On PostgreSQL the server's requests borrow from a bounded pool (haru/settings.py); the data
    path must never queue behind REST load for a pooled connection, nor wait the pool's timeout
    when the database refuses (a refused connect fails at once here, so the proxy fails open at
    once). Same settings (the same dict, so what points the default alias elsewhere points this
    too); only the pool is switched off, for this thread alone.
    """
    default = connections["default"]
    if default.settings_dict.get("OPTIONS", {}).get("pool"):
        connections["default"] = unpooled(default)


_EXECUTOR = ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="haru-proxy-db", initializer=own_connection
)


class StoreUnreachable(Exception):
    """The state store could not be asked: the data path may fail open."""


class StoreUnusable(Exception):
    """The state store answered, but not with state the proxy can route on: fail closed."""


@dataclass(frozen=True)
class Pointer:
    """A fleet's routing pointer as one indexed read returns it."""

    fleet_id: str
    slug: str
    active_domain_id: str | None
    revision: int


@dataclass(frozen=True)
class BindingRow:
    name: str
    serving_url: str
    slot_kind: str
    slot_state: str
    slot_domain_id: str
    slot_id: str
    gpu_index: int
    health: str = ServerHealth.UNKNOWN  # the model's own server
    engine: str = ""  # the binding's profile engine (vllm, sim, ...): "" when none is named


@dataclass(frozen=True)
class SnapshotRows:
    """Everything a routing snapshot is built from, read in one go."""

    pointer: Pointer
    domain_fleet_id: str | None  # None: the pointer names a domain that does not exist
    domain_slug: str | None
    domain_state: str | None
    bindings: tuple[BindingRow, ...]
    # The fleet's `route_splits` as stored ({} on the healthy path: no split, no more reads),
    # and, only when there are splits, the candidate domains' bindings of the split models.
    splits: Any = None
    candidates: tuple[CandidateRow, ...] = ()
    # The fleet's `adapter_routes` as stored ({} on a fleet without adapters: no more reads),
    # and, only when there are routes, the probed copies of the routed names as
    # (domain id, adapter name, version): fleets/proxy/adapters.py routes on them.
    adapter_routes: Any = None
    probed: tuple[tuple[str, str, int], ...] = ()
    # The fleet's bindings on its other domains (the standby's, asleep or not): a stream cut
    # on the active reads the text before its seam from one of them while it is held
    # (fleets/proxy/continuation.py). Never routed to from here.
    spares: tuple[BindingRow, ...] = ()


@dataclass(frozen=True)
class CandidateRow:
    """A split model's binding on its candidate domain, with that domain's own state."""

    domain_id: str
    domain_fleet_id: str
    domain_state: str
    binding: BindingRow


class _DatabaseThread:
    # When the read now running on the database thread began (monotonic), None while it is
    # idle. A frozen database (SIGSTOPped, black-holed) holds that read for as long as it stays
    # frozen: the routing cache reads this to stop queueing requests behind it (snapshots.py).
    __slots__ = ("busy_since",)

    def __init__(self) -> None:
        self.busy_since: float | None = None


_thread = _DatabaseThread()


def run(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """Run `fn(*args)` on the proxy's database thread; await the returned future."""
    return asyncio.get_running_loop().run_in_executor(_EXECUTOR, _timed, fn, *args)


def _timed(fn: Callable[..., T], *args: Any) -> T:
    _thread.busy_since = time.monotonic()
    try:
        return fn(*args)
    finally:
        _thread.busy_since = None


def stalled_for() -> float:
    """Seconds the database thread has been in its current read (0 when idle)."""
    since = _thread.busy_since
    return 0.0 if since is None else time.monotonic() - since


# The Fleet columns a Pointer is read from, in the order `_pointer` takes them.
_POINTER_FIELDS = ("id", "slug", "active_domain", "route_revision")


def _pointer(row: tuple[Any, ...]) -> Pointer:
    """The Pointer of one row of `_POINTER_FIELDS` (raw SQL or `values_list`, either backend)."""
    return Pointer(
        fleet_id=_uuid_str(row[0]),
        slug=row[1],
        active_domain_id=_uuid_text(row[2]),
        revision=int(row[3]),
    )


@functools.cache
def _sql() -> tuple[str, str]:
    quote = connections["default"].ops.quote_name
    meta = Fleet._meta
    cols = ", ".join(
        quote(meta.get_field(name).column)  # type: ignore[union-attr,arg-type]  # concrete fields
        for name in _POINTER_FIELDS
    )
    table = quote(meta.db_table)
    by_slug = f"SELECT {cols} FROM {table} WHERE {quote('slug')} = %s"
    # Both lookups use an index (the primary key, the unique slug); the caller prefers the id
    # match, the same "UUID first" rule as selectors.fleet_get.
    by_id_or_slug = f"SELECT {cols} FROM {table} WHERE {quote('id')} = %s OR {quote('slug')} = %s"
    return by_slug, by_id_or_slug


def _uuid_text(value) -> str | None:
    return None if value is None else _uuid_str(value)


def _uuid_str(value) -> str:
    # Postgres returns UUID objects, SQLite 32 hex characters: one canonical text form.
    return str(value) if isinstance(value, uuid.UUID) else str(uuid.UUID(str(value)))


def _with_connection(read: Callable[[Any], T]) -> T:
    """Call `read(connection)`, reconnecting once if a reused connection turns out dead.

    Nothing closes this thread's connection between requests (it is the point of keeping it),
    so after a database restart the first read meets a dead socket; one retry on a fresh
    connection tells a restart from an outage.
    """
    conn = connections["default"]
    for attempt in (1, 2):
        reused = conn.connection is not None
        try:
            return read(conn)
        except (OperationalError, InterfaceError) as exc:
            _drop(conn)
            if reused and attempt == 1:
                continue
            raise StoreUnreachable(type(exc).__name__) from exc
        except DatabaseError as exc:
            _drop(conn)
            raise StoreUnusable(type(exc).__name__) from exc
    raise AssertionError("unreachable")


def _drop(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - a broken connection may fail to close; forget it anyway
        conn.connection = None


def pointer_read(ref: str, as_id: uuid.UUID | None) -> Pointer | None:
    """Return the pointer of the fleet whose id (tried first) or slug is `ref`, or None."""
    by_slug, by_id_or_slug = _sql()

    def read(conn) -> Pointer | None:
        with conn.cursor() as cursor:
            if as_id is None:
                cursor.execute(by_slug, [ref])
            else:
                pk = Fleet._meta.pk.get_db_prep_value(as_id, conn)
                cursor.execute(by_id_or_slug, [pk, ref])
            rows = cursor.fetchall()
        if not rows:
            return None
        pointers = [_pointer(row) for row in rows]
        if as_id is not None:
            wanted = str(as_id)
            pointers.sort(key=lambda p: p.fleet_id != wanted)
        return pointers[0]

    return _with_connection(read)


def snapshot_rows_read(fleet_id: str) -> SnapshotRows | None:
    """Read what the routing snapshot of `fleet_id` needs; None when the fleet is gone."""

    def read(conn) -> SnapshotRows | None:
        fleet = (
            Fleet.objects.filter(pk=fleet_id)
            .values_list(*_POINTER_FIELDS, "route_splits", "adapter_routes")
            .first()
        )
        if fleet is None:
            return None
        pointer = _pointer(fleet)
        splits, adapter_routes = fleet[len(_POINTER_FIELDS) :]
        # Only a fleet with splits pays the one more (indexed) read of its candidates, and
        # only one with adapter routes the one more read of its probed copies.
        candidates = _candidates_read(splits) if splits else ()
        probed = _probed_read(pointer.fleet_id, adapter_routes) if adapter_routes else ()
        extra = {"adapter_routes": adapter_routes, "probed": probed}
        if pointer.active_domain_id is None:
            return SnapshotRows(pointer, None, None, None, (), splits, candidates, **extra)
        domain = (
            Domain.objects.filter(pk=pointer.active_domain_id)
            .values_list("fleet_id", "slug", "state")
            .first()
        )
        rows = ModelBinding.objects.filter(domain_id=pointer.active_domain_id).values_list(
            *_BINDING_FIELDS
        )
        bindings = tuple(_binding(row) for row in rows)
        extra["spares"] = _spares_read(pointer.fleet_id, pointer.active_domain_id)
        if domain is None:
            return SnapshotRows(pointer, None, None, None, bindings, splits, candidates, **extra)
        return SnapshotRows(
            pointer,
            _uuid_text(domain[0]),
            domain[1],
            domain[2],
            bindings,
            splits,
            candidates,
            **extra,
        )

    return _with_connection(read)


# The ModelBinding columns a BindingRow is read from, in the order `_binding` takes them.
_BINDING_FIELDS = (
    "name",
    "serving_url",
    "slot__kind",
    "slot__state",
    "slot__domain_id",
    "slot_id",
    "slot__gpu_index",
    "health",
    "profile",
)


def _binding(row: tuple[Any, ...]) -> BindingRow:
    name, url, kind, state, slot_domain, slot_id, gpu_index, health, profile = row[:9]
    return BindingRow(
        name=name,
        serving_url=url,
        slot_kind=kind,
        slot_state=state,
        slot_domain_id=_uuid_str(slot_domain),
        slot_id=_uuid_str(slot_id),
        gpu_index=gpu_index,
        health=health,
        engine=_engine(profile),
    )


# At most this many bindings of the other domains are read (a fleet has few domains, each
# serving a few models; a row past it only loses a prefetch, never a route).
MAX_SPARE_ROWS = 64


def _spares_read(fleet_id: str, active_domain_id: str) -> tuple[BindingRow, ...]:
    """The fleet's bindings outside its active domain, in one indexed read."""
    rows = (
        ModelBinding.objects.filter(domain__fleet_id=fleet_id)
        .exclude(domain_id=active_domain_id)
        .order_by("domain_id", "name")
        .values_list(*_BINDING_FIELDS)[:MAX_SPARE_ROWS]
    )
    return tuple(_binding(row) for row in rows)


def _candidates_read(splits: Any) -> tuple[CandidateRow, ...]:
    """The bindings of the split models on their candidate domains, in one indexed read.

    Whatever of the stored splits cannot be read as (model, candidate domain UUID) is skipped
    here: the snapshot (snapshots.py) judges the splits and ignores a malformed one.
    """
    if not isinstance(splits, dict):
        return ()
    wanted: dict[str, set[str]] = {}
    for model, raw in list(splits.items())[:MAX_SPLITS]:
        domain = raw.get("candidateDomain") if isinstance(raw, dict) else None
        try:
            domain_id = str(uuid.UUID(str(domain)))
        except ValueError:
            continue
        wanted.setdefault(domain_id, set()).add(str(model))
    if not wanted:
        return ()
    rows = ModelBinding.objects.filter(
        domain_id__in=list(wanted), name__in=sorted(set().union(*wanted.values()))
    ).values_list(*_BINDING_FIELDS, "domain_id", "domain__fleet_id", "domain__state")
    out = []
    for row in rows:
        domain_id = _uuid_str(row[9])
        if row[0] in wanted.get(domain_id, ()):
            out.append(
                CandidateRow(
                    domain_id=domain_id,
                    domain_fleet_id=_uuid_str(row[10]),
                    domain_state=row[11],
                    binding=_binding(row),
                )
            )
    return tuple(out)


# A fleet routes at most MAX_ADAPTER_ROUTES names, two versions each, on a few domains; the
# read keeps the newest versions first and never more than this many rows.
MAX_PROBED_ROWS = MAX_ADAPTER_ROUTES * 2 * 8


def _probed_read(fleet_id: str, routes: Any) -> tuple[tuple[str, str, int], ...]:
    """The probed copies of the routed adapter names on every domain of the fleet, in one
    indexed read: (domain id, name, version).

    Whatever of the stored routes is not an object of names is skipped here: the snapshot
    (snapshots.py) judges the routes and routes no adapter of a fleet whose routes it refuses.
    """
    if not isinstance(routes, dict):
        return ()
    names = sorted(str(name) for name in list(routes)[:MAX_ADAPTER_ROUTES])
    rows = (
        AdapterCopy.objects.filter(
            adapter__fleet_id=fleet_id,
            adapter__name__in=names,
            adapter__state=AdapterVersionState.REGISTERED.value,
            state=CopyState.PROBED.value,
        )
        .order_by("-adapter__version")
        .values_list("domain_id", "adapter__name", "adapter__version")[:MAX_PROBED_ROWS]
    )
    return tuple((_uuid_str(domain), name, int(version)) for domain, name, version in rows)


def _engine(profile: Any) -> str:
    return engine_of(profile) or ""


def connection_close() -> None:
    """Close the database thread's connection (run it on that thread, via `run`)."""
    _drop(connections["default"])
