"""Route intent: the provider-neutral answer to "where should traffic go now".

External routers and Haru's own chat proxy read the same document, so they agree on who serves.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleets.core.failover import rank_standbys
from fleets.core.model_health import is_model_servable
from fleets.core.read_model import DomainView, FleetView, ModelView
from fleets.core.timestamps import utc_iso
from fleets.core.urls import without_userinfo


def is_model_routable(domain: DomainView, model: ModelView) -> bool:
    """Tell whether a model may take traffic: its own server is not reported down and the
    control plane left it serving (fleets.core.model_health.is_model_servable)."""
    return is_model_servable(domain.state, model.slot_state, model.health)


def _target(domain: DomainView, *, active: bool) -> dict[str, Any]:
    # Only the active routes: a just-demoted standby can still report serving slots until its
    # sleep lands, and those must not attract traffic.
    models = [
        {
            "name": m.name,
            "servingUrl": without_userinfo(m.serving_url),
            "eligible": active and is_model_routable(domain, m),
        }
        for m in sorted(domain.models, key=lambda m: m.name)
    ]
    return {
        "domainId": domain.id,
        "domainSlug": domain.slug,
        "endpointUrl": without_userinfo(domain.serving_base_url or "") or None,
        "eligible": active and bool(domain.serving_base_url) and any(m["eligible"] for m in models),
        "weight": 1 if active else 0,
        "models": models,
    }


def build_route_intent(fleet: FleetView, generated_at: datetime) -> dict[str, Any]:
    """Build the route intent document of a fleet at `generated_at` (timezone-aware: a naive
    one raises ValueError)."""
    active = fleet.active
    return {
        "fleetId": fleet.id,
        "fleetSlug": fleet.slug,
        "revision": fleet.route_revision,
        "generatedAt": utc_iso(generated_at),
        "active": _target(active, active=True) if active is not None else None,
        "standbys": [_target(d, active=False) for d in rank_standbys(fleet, generated_at)],
    }
