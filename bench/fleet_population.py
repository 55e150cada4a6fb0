"""Put many two-domain fleets in the database, for the operator's reads at scale.

    populate(1000)  # inside a configured Django, against a migrated database

The first fleet goes through the layout service (`layout_apply` of the two-domain example,
under the default policy), so its rows are what a real fleet's are; the others are copies of
its rows written by bulk insert (a thousand layouts applied one by one take minutes, and the
reads measured here do not care how the rows were written). Each fleet gets its own supervisor
and serving URLs, a history (a succeeded promotion with its step events, a drill on every
third), and a deterministic mix of trouble so that every filter has something to find:

- `index % 10 == 1`: the active domain failed (unhealthy, red);
- `index % 10 == 2`: the standby failed (not ready to fail over, amber);
- `index % 7 == 3`: a promotion in flight, at its wake step (mid-operation);
- every other fleet: both domains ready and heartbeating.

`touch_heartbeats()` marks every ready domain seen now (one UPDATE), as a farm of supervisors
would, so that a measurement taken minutes after `populate` still sees the healthy as healthy.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fleet.two-domain.json"
# Rows per bulk insert: well under SQLite's bound on variables in one statement.
BATCH = 500


def trouble(index: int) -> dict[str, bool]:
    """Which trouble fleet number `index` is seeded with (see the module's docstring)."""
    return {
        "active_failed": index % 10 == 1,
        "standby_failed": index % 10 == 2,
        "in_operation": index % 7 == 3,
    }


def _template(prefix: str) -> Any:
    from fleets.layouts.loader import parse_layout  # noqa: PLC0415 - needs Django set up
    from fleets.models import Fleet  # noqa: PLC0415
    from fleets.services.layouts import layout_apply  # noqa: PLC0415

    data = json.loads(EXAMPLE.read_text())
    data["slug"] = f"{prefix}-0000"
    data["displayName"] = f"{prefix} fleet 0"
    data["policy"] = {}  # the default policy, as the measurements ask
    layout_apply(layout=parse_layout(data))
    return Fleet.objects.get(slug=data["slug"])


def _clone(row: Any, **changes: Any) -> Any:
    new = copy.copy(row)
    new._state = type(row._state)()
    for name, value in changes.items():
        setattr(new, name, value)
    return new


def populate(count: int, *, prefix: str = "scale", now: datetime | None = None) -> list[Any]:
    """Write `count` fleets named `<prefix>-0000`... and return them, by slug."""
    from fleets.base import clock  # noqa: PLC0415 - needs Django set up
    from fleets.core.states import (  # noqa: PLC0415
        FAILOVER_PATH,
        DomainState,
        OperationKind,
        OperationState,
    )
    from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Slot  # noqa: PLC0415

    now = now or clock.now()
    template = _template(prefix)
    t_domains = list(Domain.objects.filter(fleet=template).order_by("priority"))
    t_slots = list(Slot.objects.filter(domain__fleet=template))
    t_bindings = list(ModelBinding.objects.filter(domain__fleet=template))
    fleets, domains, slots, bindings, ops, events = [], [], [], [], [], []
    actives: dict[uuid.UUID, uuid.UUID] = {}
    for index in range(count):
        hard = trouble(index)
        if index == 0:
            fleet = template
        else:
            fleet = _clone(
                template,
                id=uuid.uuid4(),
                slug=f"{prefix}-{index:04d}",
                display_name=f"{prefix} fleet {index}",
                active_domain_id=None,
            )
            fleets.append(fleet)
        new_domain = {}
        for rank, d in enumerate(t_domains):
            failed = hard["active_failed"] if rank == 0 else hard["standby_failed"]
            host = f"10.{index // 250}.{index % 250}.{rank + 1}"
            changes = {
                "supervisor_url": f"http://{host}:8701",
                "serving_base_url": f"http://{host}:18001",
                "state": DomainState.FAILED if failed else DomainState.READY,
                "state_updated_at": now,
                "last_seen_at": now - timedelta(minutes=10) if failed else now,
            }
            if index:
                nd = _clone(d, id=uuid.uuid4(), fleet_id=fleet.id, **changes)
                domains.append(nd)
            else:
                nd = d
                for name, value in changes.items():
                    setattr(nd, name, value)
                nd.save()
            new_domain[d.id] = nd
        new_slot = {s.id: s for s in t_slots}
        for s in t_slots if index else ():
            ns = _clone(s, id=uuid.uuid4(), domain_id=new_domain[s.domain_id].id)
            new_slot[s.id] = ns
            slots.append(ns)
        for b in t_bindings:
            if index:
                bindings.append(
                    _clone(
                        b,
                        id=uuid.uuid4(),
                        domain_id=new_domain[b.domain_id].id,
                        slot_id=new_slot[b.slot_id].id,
                    )
                )
        active, standby = (new_domain[d.id] for d in t_domains[:2])
        actives[fleet.id] = active.id  # set once the domains are written (a foreign key)
        ops.append(_promotion(fleet, standby, active, now - timedelta(hours=index % 48 + 1)))
        events += _step_events(fleet, ops[-1], FAILOVER_PATH)
        if index % 3 == 0:
            drill = _promotion(fleet, standby, active, now - timedelta(hours=2))
            drill.kind, drill.drill_mode, drill.reason = OperationKind.DRILL, "check", "drill"
            drill.routing_committed, drill.served_at = False, None
            ops.append(drill)
            events += _step_events(fleet, drill, FAILOVER_PATH[:-1])
        if hard["in_operation"]:
            busy = _promotion(fleet, standby, active, now)
            busy.state, busy.current_step = OperationState.RUNNING, "wake"
            busy.finished_at = busy.served_at = None
            busy.routing_committed = False
            busy.step_started_at = now
            ops.append(busy)
    Fleet.objects.bulk_create(fleets, batch_size=BATCH)
    Domain.objects.bulk_create(domains, batch_size=BATCH)
    Slot.objects.bulk_create(slots, batch_size=BATCH)
    ModelBinding.objects.bulk_create(bindings, batch_size=BATCH)
    for fleet in (template, *fleets):
        fleet.active_domain_id = actives[fleet.id]
    Fleet.objects.bulk_update([template, *fleets], ["active_domain_id"], batch_size=BATCH)
    Operation.objects.bulk_create(ops, batch_size=BATCH)
    Event.objects.bulk_create(events, batch_size=BATCH)
    return list(Fleet.objects.filter(slug__startswith=f"{prefix}-").order_by("slug"))


def _promotion(fleet: Any, target: Any, source: Any, finished: datetime) -> Any:
    from fleets.core.states import OperationKind, OperationState  # noqa: PLC0415
    from fleets.models import Operation  # noqa: PLC0415

    return Operation(
        id=uuid.uuid4(),
        fleet_id=fleet.id,
        kind=OperationKind.PROMOTE,
        state=OperationState.SUCCEEDED,
        target_domain_id=target.id,
        target_domain_slug=target.slug,
        source_domain_id=source.id,
        routing_committed=True,
        reason="manual",
        created_at=finished - timedelta(seconds=3),
        started_at=finished - timedelta(seconds=3),
        served_at=finished - timedelta(seconds=1),
        finished_at=finished,
    )


# Each step's duration in a populated fleet's history (ms).
_STEP_MS = {"stop_training": 120, "verify_gpu": 40, "wake": 900, "probe": 300, "switch_route": 15}


def _step_events(fleet: Any, op: Any, steps: tuple[str, ...]) -> list[Any]:
    from fleets.models import Event  # noqa: PLC0415 - needs Django set up

    return [
        Event(
            fleet_id=fleet.id,
            operation_id=op.id,
            kind="operation.step.done",
            step=step,
            duration_ms=_STEP_MS[step],
            created_at=op.finished_at,
        )
        for step in steps
    ]


def touch_heartbeats(prefix: str = "scale") -> int:
    """Mark every ready domain of the populated fleets seen now; return how many."""
    from fleets.base import clock  # noqa: PLC0415 - needs Django set up
    from fleets.core.states import DomainState  # noqa: PLC0415
    from fleets.models import Domain  # noqa: PLC0415

    return Domain.objects.filter(
        fleet__slug__startswith=f"{prefix}-", state=DomainState.READY
    ).update(last_seen_at=clock.now())
