"""What a reconcile tick reads first, in four queries: the fleet with what its operations and
baselines say, then its domains, slots and model bindings.

The fleet's row comes with a summary of its operations (any in flight or with a clean-up
pending; the newest one's creation and end; the last drill) and of its golden baselines (how
many, the newest id), each a subquery served by the operation and baseline indexes. A tick
decides from this whether the fleet is quiet (`TickSnapshot.quiet`): nothing in flight or
pending and no operation within the window that backoff, flap damping or a standby's restore
look back over, so none of their reads can matter, and an idle tick needs nothing else.
"""

from __future__ import annotations

import functools
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    Count,
    Exists,
    IntegerField,
    Max,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.sql import Query
from django.utils.dateparse import parse_datetime

from fleets.base import prepared
from fleets.core.failover import RESTORE_RETRY_AFTER_MS
from fleets.core.policy import Policy
from fleets.core.read_model import FleetView
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, CleanupState, OperationKind
from fleets.models import (
    Domain,
    Fleet,
    GoldenBaseline,
    Id,
    ModelBinding,
    Operation,
    Rollout,
    Slot,
)
from fleets.reads import sightings as sightings_mod
from fleets.reads.selectors import view_of


@dataclass(frozen=True)
class TickSnapshot:
    fleet: Fleet
    domains: list[Domain]
    slots: list[Slot]
    bindings: list[ModelBinding]
    view: FleetView
    open_operation: bool  # one in flight, or a clean-up pending
    newest_operation_at: datetime | None  # the newest operation's creation or end, the later
    last_drill_at: datetime | None
    baselines: tuple[int, int | None]  # how many, the newest id: changes whenever they do
    open_rollout: bool = False  # a rollout in flight (fleets/core/rollout.py): never quiet

    @property
    def policy(self) -> Policy:
        return self.view.policy

    def quiet(self, now: datetime) -> bool:
        """Nothing in flight or pending, and no operation recent enough for backoff, damping
        or a restore's retry to look at (`lookback`)."""
        if self.open_operation or self.open_rollout:
            return False
        newest = self.newest_operation_at
        return newest is None or newest < now - lookback(self.policy)


def lookback(policy: Policy) -> timedelta:
    """How far back the failover phase reads operations: backoff after failed promotions (at
    most its cap), flap damping (its window), a failed restore's retry."""
    return timedelta(
        milliseconds=max(
            policy.failover_backoff_max_ms, policy.flap_window_ms, RESTORE_RETRY_AFTER_MS
        )
    )


# Compiling a queryset costs more CPU than running it on an idle fleet (the annotated fleet
# query alone about 2 ms), so each of the four is compiled once per process and database
# vendor, for a stand-in fleet id, and run raw with the real one.
_STAND_IN = uuid.UUID(int=0)


def _fleet_query(fleet_id: Any) -> QuerySet[Fleet]:
    operations = Operation.objects.filter(fleet_id=OuterRef("pk"))
    # Operations of one fleet run one at a time (one in flight, by constraint), so the newest
    # one also ended last: its end is the fleet's latest.
    newest = operations.order_by("-created_at")
    baselines = GoldenBaseline.objects.filter(fleet_id=OuterRef("pk")).order_by().values("fleet_id")
    return Fleet.objects.filter(pk=fleet_id).annotate(
        open_operation=Exists(
            operations.filter(
                Q(state__in=IN_FLIGHT_OPERATION_STATES) | Q(cleanup=CleanupState.PENDING)
            )
        ),
        open_rollout=Exists(
            Rollout.objects.filter(fleet_id=OuterRef("pk"), state__in=IN_FLIGHT_ROLLOUT_STATES)
        ),
        newest_created=Subquery(newest.values("created_at")[:1]),
        newest_finished=Subquery(newest.values("finished_at")[:1]),
        last_drill=Subquery(newest.filter(kind=OperationKind.DRILL).values("created_at")[:1]),
        baseline_count=Subquery(
            baselines.annotate(n=Count("id")).values("n")[:1], output_field=IntegerField()
        ),
        baseline_newest=Subquery(
            baselines.annotate(m=Max("id")).values("m")[:1], output_field=IntegerField()
        ),
    )


_QUERIES: dict[type[Model], Callable[[Any], QuerySet[Any]]] = {
    Fleet: _fleet_query,
    Domain: lambda fleet_id: Domain.objects.filter(fleet_id=fleet_id),
    Slot: lambda fleet_id: Slot.objects.filter(domain__fleet_id=fleet_id),
    ModelBinding: lambda fleet_id: ModelBinding.objects.filter(domain__fleet_id=fleet_id),
}


@functools.cache
def _compiled(model: type[Model], vendor: str) -> tuple[str, tuple[Any, ...]]:
    """The query's SQL and parameters for the stand-in id (`vendor` keys the cache)."""
    return _QUERIES[model](_STAND_IN).query.sql_with_params()


@dataclass(frozen=True)
class _Reader:
    """How one query's rows become instances, as Django's raw queryset works it out on every
    run (which model field each column fills, the rest annotations, the converters of each):
    the same for every run of the same SQL on the same connection, so worked out once."""

    names: list[str]  # the attnames `Model.from_db` is given, in order
    positions: list[int]  # where each of them is in a row
    annotations: list[tuple[str, int]]  # the other columns: set as attributes
    converters: list[tuple[int, list[Any], Any]]  # position, converters, expression
    pk_at: int  # where the primary key is in a row
    # Row id -> (the row as the database sent it, its values converted): an idle fleet's rows
    # come back the same tick after tick, and decoding their JSON columns (a domain's report,
    # layout, placement; a slot's spec) was a good part of the snapshot's CPU. At most one
    # entry per row of the table (a changed row replaces its entry); bounded besides.
    converted: dict[Any, tuple[tuple[Any, ...], list[Any]]] = field(default_factory=dict)


# Past this many rows a reader's conversions are forgotten (and remembered again as read).
_CONVERTED_MAX = 20_000


# Per connection (the converters are the connection's own), per model and row shape; a
# connection gone (its thread ended) takes its readers with it.
_readers: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], _Reader]] = (
    weakref.WeakKeyDictionary()
)


def _reader(db: BaseDatabaseWrapper, model: type[Model], columns: tuple[str, ...]) -> _Reader:
    cached = _readers.setdefault(db, {})
    reader = cached.get((model, columns))
    if reader is not None:
        return reader
    # As `RawQuerySet.resolve_model_init_order` and `RawModelIterable` do it.
    converter = db.introspection.identifier_converter
    by_column = {converter(f.column): f for f in model._meta.fields}
    fields = [f for f in model._meta.fields if converter(f.column) in columns]
    # The model's columns by position (annotations are set as they come, unconverted).
    at = [i for i, c in enumerate(columns) if c in by_column]
    cols = [by_column[columns[i]].get_col(model._meta.db_table) for i in at]
    compiler = db.ops.compiler("SQLCompiler")(Query(model), db, db.alias)
    found = compiler.get_converters(list(cols))
    reader = cached[(model, columns)] = _Reader(
        names=[f.attname for f in fields],
        positions=[columns.index(converter(f.column)) for f in fields],
        annotations=[(c, i) for i, c in enumerate(columns) if c not in by_column],
        converters=[(at[j], convs, col) for j, (convs, col) in found.items()],
        pk_at=columns.index(converter(model._meta.pk.column)),
    )
    return reader


def _rows(model: type[Model], fleet_id: Any) -> list[Any]:
    """Run the model's compiled query for `fleet_id`; its rows as instances (annotations set),
    as `Model.objects.raw` would return them."""
    db = connections[DEFAULT_DB_ALIAS]
    sql, params = _compiled(model, db.vendor)
    real = uuid.UUID(str(fleet_id))
    # The stand-in appears as the backend stores a UUID: a UUID, or its hex (SQLite).
    bound = [real if p == _STAND_IN else real.hex if p == _STAND_IN.hex else p for p in params]
    with prepared.cursor() as cursor:  # planned once per connection, not every tick
        cursor.execute(sql, bound)
        converter = db.introspection.identifier_converter
        columns = tuple(converter(d[0]) for d in cursor.description)
        rows = cursor.fetchall()
    reader = _reader(db, model, columns)
    out = []
    for row in rows:
        values = _converted(reader, db, row)
        instance = model.from_db(db.alias, reader.names, [values[p] for p in reader.positions])
        for column, position in reader.annotations:
            setattr(instance, column, values[position])
        out.append(instance)
    return out


def _converted(reader: _Reader, db: BaseDatabaseWrapper, row: tuple[Any, ...]) -> list[Any]:
    """The row's values through the columns' converters: as converted the last time the same
    row came back unchanged, else converted now (and remembered).

    The converted values (the JSON columns' dicts and lists included) are shared by the
    instances built from them: a tick reads them and never changes them in place (a write
    builds a new value)."""
    key = row[reader.pk_at]
    held = reader.converted.get(key)
    if held is not None and held[0] == row:
        return held[1]
    values = list(row)
    for position, convs, expression in reader.converters:
        value = values[position]
        for convert in convs:
            value = convert(value, expression, db)
        values[position] = value
    if len(reader.converted) >= _CONVERTED_MAX:
        reader.converted.clear()
    reader.converted[key] = (row, values)
    return values


def _as_datetime(value: Any) -> datetime | None:
    """An annotation read raw: SQLite hands back naive UTC text, PostgreSQL a datetime."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def tick_snapshot(
    fleet_id: Id, sightings: sightings_mod.Sightings | None = None
) -> TickSnapshot | None:
    """Read the fleet and everything an idle tick decides on; None if it does not exist.

    `sightings`: the heartbeat sightings on the fleet's tick lease, as its take returned them
    (`fleets.reads.sightings`): each domain's `last_seen_at` is the later of its row's and its
    sighting, and sightings of domains the fleet no longer has are dropped from it. None: read
    from the lease (one more statement: a tick without a lease)."""
    fleets = _rows(Fleet, fleet_id)
    if not fleets:
        return None
    fleet = fleets[0]
    domains = _rows(Domain, fleet.id)
    if sightings is None:
        sightings_mod.overlay(domains, sightings_mod.sightings_of([fleet.id]))
    else:
        own = {str(d.id) for d in domains}
        for gone in [key for key in sightings if key not in own]:
            del sightings[gone]
        sightings_mod.overlay(domains, sightings)
    slots = _rows(Slot, fleet.id)
    bindings = _rows(ModelBinding, fleet.id)
    times = [
        t
        for t in (_as_datetime(fleet.newest_created), _as_datetime(fleet.newest_finished))
        if t is not None
    ]
    return TickSnapshot(
        fleet=fleet,
        domains=domains,
        slots=slots,
        bindings=bindings,
        view=view_of(fleet, domains, slots, bindings),
        open_operation=bool(fleet.open_operation),
        newest_operation_at=max(times, default=None),
        last_drill_at=_as_datetime(fleet.last_drill),
        baselines=(int(fleet.baseline_count or 0), fleet.baseline_newest),
        open_rollout=bool(fleet.open_rollout),
    )
