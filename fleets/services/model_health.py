"""Per-model serving health writes (fleets.core.model_health decides; this records).

A heartbeat is read over HTTP before it is applied, so a slower beat can finish after a faster
one: every write is a conditional UPDATE guarded by `health_at <= observed_at` (older news never
overwrites newer; of two taken at the same instant, the one applied last wins), and the edge
event (`model.serving.up` / `.down`) is written once, by the write that changed the value it
read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleets.base import clock
from fleets.core.model_health import ServerHealth
from fleets.models import Id, ModelBinding
from fleets.services.events import EventFields, guarded_update, not_newer


def model_health_record(
    *,
    binding_id: Id,
    health: ServerHealth,
    observed_at: datetime,
    source: str,
    actor: str = "heartbeat",
) -> bool:
    """Record what one beat observed of one model's server; return whether the row moved.

    `source` says who told (`supervisor`, `direct`, `datapath`), for the edge event.
    """
    binding = ModelBinding.objects.filter(pk=binding_id)
    row = binding.values("health", "name", "domain_id", "domain__fleet_id").first()
    if row is None:
        return False
    values: dict[str, Any] = {"health": health, "health_at": observed_at}
    if health == ServerHealth.UP:
        values["serving_seen_at"] = observed_at
    edge: EventFields = {
        "fleet_id": row["domain__fleet_id"],
        "domain_id": row["domain_id"],
        "kind": f"model.serving.{health}",
        "actor": actor,
        "data": {
            "model": row["name"],
            "from": row["health"],
            "to": str(health),
            "source": source,
            "observedAt": clock.iso(observed_at),
        },
    }
    # Guarded by the value read (so the edge is decided once) and by "newer than what is
    # recorded" (a slower beat loses).
    moved = guarded_update(
        binding.filter(health=row["health"]).filter(
            not_newer("health_at", observed_at, tie_wins=True)
        ),
        values,
        *([edge] if row["health"] != health else []),
    )
    return bool(moved)
