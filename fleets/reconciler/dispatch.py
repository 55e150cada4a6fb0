"""One periodic dispatch's plan: which fleets to tick now, which later, in two queries for all.

Used by Celery beat's fan-out (`fleets.tasks.reconcile_all`) and by the in-process loop
(`fleets.reconciler.loop`). The decision per fleet is `fleets.core.dispatch.tick_due_in`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Q

from fleets.base import clock
from fleets.core.dispatch import RECENT_SHARE, TickLeaseRow, tick_due_in
from fleets.models import Domain, Lease
from fleets.reconciler.locks import local_and_dead, tick_lease_name
from fleets.reconciler.tick import fleets_to_reconcile
from fleets.services.provisioning import is_managed

_PREFIX = tick_lease_name("")


@dataclass(frozen=True)
class DispatchPlan:
    """Fleet ids to tick now, and the others with the seconds until each is worth a tick."""

    now: list[str] = field(default_factory=list)
    # Held by a running (or dead, not yet run out) tick: when its lease runs out.
    held: dict[str, float] = field(default_factory=dict)
    # Ticked a moment ago (another worker's tick, or a kick's): one interval after its start.
    recent: dict[str, float] = field(default_factory=dict)

    def ids(self) -> list[str]:
        return [*self.now, *self.held, *self.recent]


def dispatch_plan(selection: list[str] | None, *, interval_s: float) -> DispatchPlan:
    """Plan this interval's ticks of every fleet (or those in `selection`).

    Two queries whatever the number of fleets: their ids, and the tick leases that are held or
    whose last tick started within the last half interval (the only rows that defer a tick).
    """
    ids = fleets_to_reconcile(selection)
    now = clock.now()
    recent = now - timedelta(seconds=interval_s * RECENT_SHARE)
    busy = Q(holder__gt="") | Q(acquired_at__gt=recent)
    rows = {
        name.removeprefix(_PREFIX): TickLeaseRow(holder, expires_at, acquired_at)
        for name, holder, expires_at, acquired_at in Lease.objects.filter(name__startswith=_PREFIX)
        .filter(busy)
        .values_list("name", "holder", "expires_at", "acquired_at")
    }
    plan = DispatchPlan()
    for fleet_id in ids:
        row = rows.get(fleet_id)
        wait = tick_due_in(row, now=now, interval_s=interval_s)
        if wait > 0 and row is not None and row.holder and local_and_dead(row.holder):
            # A holder of this host whose process is gone (a worker killed mid-tick): the tick
            # sent now takes the lease over at once (`TickLease.try_take`) instead of one lease
            # later. Only the task the dead process was running could do that before, and it
            # is dropped once it has expired (three intervals), as after a long step.
            wait = 0.0
        if wait <= 0:
            plan.now.append(fleet_id)
        elif row is not None and row.holder:
            plan.held[fleet_id] = wait
        else:
            plan.recent[fleet_id] = wait
    return plan


def fleets_provisioned(fleet_ids: list[str]) -> list[str]:
    """The fleets among `fleet_ids` with a domain Haru provisions itself (one query).

    Only those need a provisioning pass each interval; the others' pass finds nothing to do.
    """
    wanted = set(fleet_ids)
    managed = {
        str(domain.fleet_id)
        for domain in Domain.objects.exclude(driver={}).only("fleet_id", "provider", "driver")
        if str(domain.fleet_id) in wanted and is_managed(domain)
    }
    return [fleet_id for fleet_id in fleet_ids if fleet_id in managed]
