"""Many fleets read at once: each table once for the whole list, whatever its length.

The overview, the API's fleet list, the admin and the scrape-time metrics show every fleet or
a page of them. Read one fleet at a time (`fleet_view`: four queries, its readiness five more,
its damping one) a page of 1,000 fleets cost about ten thousand queries and seconds of time.
Here each read covers the whole list, so the number of queries is the same for 1 fleet or
1,000 (tests/dashboard/test_fleet_list_scale.py counts them); the verdicts themselves are the
core's, exactly as the one-fleet reads get them.

A status filter (`FleetStatus`) is derived from those verdicts (health, readiness, the
operation in flight), so a filtered list reads every fleet the search matched, then pages.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from fleets.core.flapping import Damping, flap_damping
from fleets.core.read_model import FleetView
from fleets.core.readiness import Readiness, ReadinessVerdict, failover_readiness, pick_standby
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, OperationKind
from fleets.models import Domain, Fleet, GoldenBaseline, ModelBinding, Operation, Slot
from fleets.reads.fleet_health import HEARTBEAT_NOTE, fleet_health, heartbeat_errors
from fleets.reads.readiness import BASELINE_COLUMNS, drill_facts, finished_drills, standby_facts
from fleets.reads.selectors import AUTO_FAILOVER, view_of
from fleets.reads.sightings import overlay, sightings_of

# The longest search string taken (a slug is at most 63 characters, a name 200).
MAX_SEARCH = 200


class FleetStatus(StrEnum):
    """The list filters an operator of many fleets asks for first."""

    UNHEALTHY = "unhealthy"  # health amber or red (fleets.reads.fleet_health)
    NOT_READY = "not_ready"  # readiness verdict not_ready: a failover now would fail
    IN_OPERATION = "in_operation"  # an operation pending or running


def search(fleets: QuerySet[Fleet], text: str | None) -> QuerySet[Fleet]:
    """`fleets` whose slug or display name contains `text` (any case); all for no text."""
    text = (text or "").strip()[:MAX_SEARCH]
    if not text:
        return fleets
    return fleets.filter(Q(slug__icontains=text) | Q(display_name__icontains=text))


def in_operation(fleets: QuerySet[Fleet]) -> QuerySet[Fleet]:
    """`fleets` with an operation in flight (one subquery, served by the partial index)."""
    busy = Operation.objects.filter(state__in=IN_FLIGHT_OPERATION_STATES).values("fleet_id")
    return fleets.filter(pk__in=busy)


@dataclass
class FleetRows:
    """The rows of a set of fleets, read once, grouped by fleet and by domain."""

    fleets: list[Fleet]
    # Rows with the models' attribute names (named tuples of the columns a list reads).
    domains: dict[uuid.UUID, list[Any]]
    slots: dict[uuid.UUID, list[Any]]  # by domain id
    bindings: dict[uuid.UUID, list[Any]]  # by domain id
    views: dict[uuid.UUID, FleetView]

    def view(self, fleet: Fleet) -> FleetView:
        return self.views[fleet.pk]


# The columns a list reads: what the core's view, the health and the heartbeat poll need. The
# layout's JSON (slot specs and allocations, model profiles, golden settings) is read only for
# the standbys a readiness verdict judges (`readinesses`): decoding it for every row of 1,000
# fleets was most of a scrape's time.
_DOMAIN_COLUMNS = (
    "id",
    "fleet_id",
    "slug",
    "state",
    "provider",
    "priority",
    "supervisor_url",
    "serving_base_url",
    "last_seen_at",
    "state_updated_at",
    # Only the heartbeat's note of the last report (the health's one need of it), not the whole
    # report with its GPUs and servers: the database extracts the key.
    HEARTBEAT_NOTE,
)
_SLOT_COLUMNS = ("id", "domain_id", "gpu_index", "kind", "state")
_BINDING_COLUMNS = (
    "id",
    "domain_id",
    "slot_id",
    "name",
    "serving_url",
    "health",
    "serving_seen_at",
)


def fleet_rows(fleets: Iterable[Fleet]) -> FleetRows:
    """Read the domains, slots and bindings of `fleets` (three queries) and build their views."""
    fleets = list(fleets)
    ids = [f.pk for f in fleets]
    domains: dict[uuid.UUID, list[Any]] = defaultdict(list)
    slots: dict[uuid.UUID, list[Any]] = defaultdict(list)
    bindings: dict[uuid.UUID, list[Any]] = defaultdict(list)
    if ids:
        # Named tuples with the models' attribute names, not model instances: building 10,000
        # instances cost more than the queries (`view_of` reads attributes only).
        for d in (
            Domain.objects.filter(fleet_id__in=ids)
            .order_by()
            .values_list(*_DOMAIN_COLUMNS, named=True)
        ):
            domains[d.fleet_id].append(d)
        for s in (
            Slot.objects.filter(domain__fleet_id__in=ids)
            .order_by()
            .values_list(*_SLOT_COLUMNS, named=True)
        ):
            slots[s.domain_id].append(s)
        for b in (
            ModelBinding.objects.filter(domain__fleet_id__in=ids)
            .order_by()
            .values_list(*_BINDING_COLUMNS, named=True)
        ):
            bindings[b.domain_id].append(b)
        # A healthy host's last heartbeat may be kept on its fleet's tick lease (one query).
        seen = sightings_of(ids)
        if seen:
            for fleet_id, rows in domains.items():
                domains[fleet_id] = overlay(rows, seen)
    # The orders of the models' Meta, kept in Python: the database sorts faster without them.
    for domain_slots in slots.values():
        domain_slots.sort(key=lambda s: (s.gpu_index, s.kind))
    for domain_bindings in bindings.values():
        domain_bindings.sort(key=lambda b: b.name)
    views = {}
    for f in fleets:
        own = sorted(domains[f.pk], key=lambda d: (d.priority, d.slug))
        domains[f.pk] = own
        views[f.pk] = view_of(
            f,
            own,
            [s for d in own for s in slots[d.id]],
            [b for d in own for b in bindings[d.id]],
        )
    return FleetRows(fleets, domains, slots, bindings, views)


# The key under which one scrape's collectors share `every_fleet_rows` (fleets.metrics.scrape).
FLEET_ROWS = "fleet rows"


def every_fleet_rows() -> FleetRows:
    """The rows of every fleet, by slug."""
    return fleet_rows(Fleet.objects.order_by("slug"))


def in_flight_operations(fleet_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Operation]:
    """The operation in flight of each of the fleets that has one (one query)."""
    ops = Operation.objects.filter(
        fleet_id__in=list(fleet_ids), state__in=IN_FLIGHT_OPERATION_STATES
    ).select_related("target_domain")
    return {op.fleet_id: op for op in ops}


def dampings(rows: FleetRows, now: datetime) -> dict[uuid.UUID, Damping | None]:
    """Each fleet's flap damping (`failover_damping_state`, one query for all of them)."""
    commits = failover_commits_by_fleet(rows, now)
    return {
        f.pk: flap_damping(commits.get(f.pk, []), rows.view(f).policy, now) for f in rows.fleets
    }


def failover_commits_by_fleet(rows: FleetRows, now: datetime) -> dict[uuid.UUID, list[datetime]]:
    """Each fleet's automatic failovers that committed within its own `flapWindowMs`
    (`failover_commits`, read once for every fleet over the longest of their windows)."""
    if not rows.fleets:
        return {}
    windows = {f.pk: rows.view(f).policy.flap_window_ms for f in rows.fleets}
    since = now - timedelta(milliseconds=max(windows.values()))
    found = Operation.objects.filter(
        fleet_id__in=list(windows),
        kind=OperationKind.PROMOTE,
        reason=AUTO_FAILOVER,
        routing_committed=True,
        served_at__gte=since,
    ).values_list("fleet_id", "served_at")
    out: dict[uuid.UUID, list[datetime]] = defaultdict(list)
    for fleet_id, at in found:
        if at is not None and at >= now - timedelta(milliseconds=windows[fleet_id]):
            out[fleet_id].append(at)
    return out


def healths(
    rows: FleetRows, now: datetime, damping: dict[uuid.UUID, Damping | None] | None = None
) -> dict[uuid.UUID, tuple[str, list[str]]]:
    """Each fleet's health at a glance (`fleet_health`), from rows already read."""
    damping = dampings(rows, now) if damping is None else damping
    return {
        f.pk: fleet_health(
            rows.view(f), now, heartbeat_errors(rows.domains[f.pk]), damping.get(f.pk)
        )
        for f in rows.fleets
    }


def last_drills(fleet_ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """Each fleet's last finished drill (one query: the newest per fleet, by window function),
    as a row of what `drill_facts` reads."""
    if not fleet_ids:
        return {}
    newest = Window(RowNumber(), partition_by=[F("fleet_id")], order_by=F("finished_at").desc())
    drills = (
        finished_drills()
        .filter(fleet_id__in=fleet_ids)
        .annotate(rank=newest)
        .filter(rank=1)
        .order_by()
        .values_list("fleet_id", "state", "finished_at", "error", named=True)
    )
    return {op.fleet_id: op for op in drills}


def readinesses(rows: FleetRows, now: datetime) -> dict[uuid.UUID, Readiness]:
    """Each fleet's failover readiness (`fleet_readiness`), six queries for all of them: the
    standby each verdict judges is read in full (its layout's JSON), the others not at all."""
    ids = [f.pk for f in rows.fleets]
    drills = last_drills(ids)
    standbys = {}
    for f in rows.fleets:
        picked = pick_standby(rows.view(f), now)
        if picked is not None:
            standbys[f.pk] = uuid.UUID(picked.id)
    judged = list(standbys.values())
    # What `standby_facts` reads of them, and no more (the layout's other JSON stays unread),
    # as named tuples with the models' attribute names: building a thousand Domain, Slot and
    # ModelBinding instances cost more than reading their rows (`standby_facts` reads
    # attributes only).
    full: dict[uuid.UUID, Any] = {
        d.id: d
        for d in Domain.objects.filter(pk__in=judged)
        .order_by()
        .values_list("id", "fleet_id", "last_report", "gpus_read_at", named=True)
    }
    slots: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for s in (
        Slot.objects.filter(domain_id__in=judged)
        .order_by("gpu_index", "kind")
        .values_list(
            "id",
            "domain_id",
            "gpu_index",
            "gpu_indices",
            "kind",
            "state",
            "allocation",
            named=True,
        )
    ):
        slots[s.domain_id].append(s)
    bindings: dict[uuid.UUID, list[Any]] = defaultdict(list)
    for b in (
        ModelBinding.objects.filter(domain_id__in=judged)
        .order_by("name")
        .values_list(
            "id", "domain_id", "slot_id", "name", "golden", "profile", "engine_version", named=True
        )
    ):
        bindings[b.domain_id].append(b)
    baselines: dict[uuid.UUID, list[tuple]] = defaultdict(list)
    if standbys:
        for fleet_id, *row in GoldenBaseline.objects.filter(
            fleet_id__in=list(standbys)
        ).values_list("fleet_id", "request_fingerprint", *BASELINE_COLUMNS):
            baselines[fleet_id].append(tuple(row))
    out = {}
    for f in rows.fleets:
        view = rows.view(f)
        facts = {}
        if f.pk in standbys:
            domain = full[standbys[f.pk]]
            facts[str(domain.id)] = standby_facts(
                domain,
                view.policy,
                slots=slots[domain.id],
                bindings=bindings[domain.id],
                baselines=baselines[f.pk],
            )
        out[f.pk] = failover_readiness(view, facts, drill_facts(drills.get(f.pk)), now)
    return out


def with_status(fleets: QuerySet[Fleet], status: FleetStatus | None, now: datetime) -> list[Fleet]:
    """The fleets of `fleets` (in its order) that are in `status` (all for None).

    Health and readiness are the core's verdicts, not columns: every fleet the query matched
    is read (a constant number of queries) and judged; the operation in flight is a subquery.
    """
    if status is None:
        return list(fleets)
    if status == FleetStatus.IN_OPERATION:
        return list(in_operation(fleets))
    rows = fleet_rows(fleets)
    if status == FleetStatus.UNHEALTHY:
        judged = healths(rows, now)
        return [f for f in rows.fleets if judged[f.pk][0] != "ok"]
    verdicts = readinesses(rows, now)
    return [f for f in rows.fleets if verdicts[f.pk].verdict == ReadinessVerdict.NOT_READY]


def parse_status(value: str | None) -> FleetStatus | None:
    """The filter a query string names ("" or absent: none); ValueError for an unknown one."""
    if not value:
        return None
    try:
        return FleetStatus(value)
    except ValueError:
        choices = ", ".join(s.value for s in FleetStatus)
        raise ValueError(f"unknown status filter {value[:40]!r}: one of {choices}") from None
