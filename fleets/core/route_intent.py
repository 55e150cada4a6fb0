"""Route intent: the provider-neutral answer to "where should traffic go now".

External routers and Haru's own chat proxy read the same document, so they agree on who serves.
A fleet with a rollout in flight also carries `splits`: per split model, its stable arm (the
active) and its candidate arm with their weights, so a router splits as the proxy does. A fleet
without one gets the document it always got (no `splits` key at all).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fleets.core.failover import rank_standbys
from fleets.core.model_health import is_model_servable
from fleets.core.read_model import DomainView, FleetView, ModelView
from fleets.core.route_split import MAX_SPLITS, PERMILLE, SplitInvalid, split_parse
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


def build_route_intent(
    fleet: FleetView, generated_at: datetime, route_splits: Any = None
) -> dict[str, Any]:
    """Build the route intent document of a fleet at `generated_at` (timezone-aware: a naive
    one raises ValueError); `route_splits` is the fleet's stored `Fleet.route_splits`."""
    active = fleet.active
    doc = {
        "fleetId": fleet.id,
        "fleetSlug": fleet.slug,
        "revision": fleet.route_revision,
        "generatedAt": utc_iso(generated_at),
        "active": _target(active, active=True) if active is not None else None,
        "standbys": [_target(d, active=False) for d in rank_standbys(fleet, generated_at)],
    }
    if route_splits:  # None or {}: the healthy path, the document as it always was
        doc["splits"], faults = _splits(fleet, route_splits)
        if faults:
            doc["splitFaults"] = faults
    return doc


# A stored key is a served model name (at most 200 characters in the database); a malformed row
# could hold anything, so what the document repeats of it is bounded.
_NAME_MAX = 200


def _arm(arm: str, domain: DomainView | None, model: str, permille: int) -> dict[str, Any]:
    found = None if domain is None else next((m for m in domain.models if m.name == model), None)
    return {
        "arm": arm,
        "domainId": domain.id if domain else None,
        "domainSlug": domain.slug if domain else None,
        "servingUrl": without_userinfo(found.serving_url) if found else None,
        # The proxy's rule: an arm that cannot serve gets no traffic, its share goes to the
        # other (docs/splits.md); a router should do the same.
        "eligible": bool(domain and found and is_model_routable(domain, found)),
        # `weight` in the targets' own format (an integer relative weight); the two arms' sum to
        # 1000, so it is also the share in per mille.
        "weight": permille,
        "weightPermille": permille,
    }


def _splits(fleet: FleetView, raw: Any) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The readable splits and, for what cannot be read, a fault each (never an exception: a
    malformed split is ignored by the proxy, whose stable arm then serves the whole model)."""
    if not isinstance(raw, Mapping):
        return [], [{"model": "", "problem": "route splits must be an object"}]
    if len(raw) > MAX_SPLITS:
        return [], [{"model": "", "problem": f"at most {MAX_SPLITS} route splits"}]
    out: list[dict[str, Any]] = []
    faults: list[dict[str, str]] = []
    active = fleet.active
    for name in sorted(raw, key=str):
        model = str(name)[:_NAME_MAX]
        try:
            split = split_parse(raw[name], model=model)
            candidate = fleet.domain(split.candidate_domain_id)
            if candidate is None:
                raise SplitInvalid(
                    f"split of {model!r}: candidateDomain is not a domain of the fleet"
                )
            if active is not None and candidate.id == active.id:
                raise SplitInvalid(f"split of {model!r}: candidateDomain is the active domain")
        except SplitInvalid as exc:
            faults.append({"model": model, "problem": str(exc)})
            continue
        out.append(
            {
                "model": model,
                "rolloutId": split.rollout_id,
                # None: the caller's API key is the stickiness key.
                "stickyHeader": split.sticky_header or None,
                "arms": [
                    _arm("stable", active, model, PERMILLE - split.weight_permille),
                    _arm("candidate", candidate, model, split.weight_permille),
                ],
            }
        )
    return out, faults
