"""A fleet's adapters as the API, the dashboard and the metrics read them: the registry's
versions with their copies per domain, each name's route, and how fresh what users get is.

Freshness, per adapter name:
- `servedAgeS`: now - completed_at of the version the route names (the age of what users are
  served; a candidate mid-rollout is not counted until it is the route's version);
- `checkpointToFirstTokenS`: first_served_at - completed_at of the newest version a user got a
  token from (how long a trained checkpoint took to reach a user).

Bounded: at most MAX_NAMES names and, per name, the MAX_VERSIONS newest versions (a retired
version's row stays forever; the page shows the recent ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleets.base.errors import AdapterNotFound
from fleets.core.adapter_rollout import ADAPTER_KIND
from fleets.core.adapter_route import AdapterRoute, AdapterRouteInvalid, adapter_routes_parse
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.models import AdapterCopy, AdapterVersion, Fleet, Id, Rollout

MAX_NAMES = 200
MAX_VERSIONS = 20


@dataclass(frozen=True)
class Freshness:
    adapter: str
    served_version: int | None
    served_age_s: float | None
    # The newest version a user got a token from, and how long after its completion.
    first_served_version: int | None
    checkpoint_to_first_token_s: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "servedVersion": self.served_version,
            "servedAgeS": _round(self.served_age_s),
            "firstServedVersion": self.first_served_version,
            "checkpointToFirstTokenS": _round(self.checkpoint_to_first_token_s),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def routes_of(fleet: Fleet) -> dict[str, AdapterRoute]:
    """The fleet's adapter routes; an unreadable document reads as none (the proxy refuses it
    the same way, and the route service says why on the next write)."""
    try:
        return adapter_routes_parse(fleet.adapter_routes)
    except AdapterRouteInvalid:
        return {}


def freshness(
    routes: Mapping[str, AdapterRoute],
    versions: Iterable[tuple[str, int, datetime, datetime | None]],
    now: datetime,
) -> list[Freshness]:
    """Freshness per routed name from (name, version, completed_at, first_served_at) rows."""
    completed: dict[tuple[str, int], datetime] = {}
    first: dict[str, tuple[int, datetime, datetime]] = {}
    for name, number, done_at, served_at in versions:
        completed[(name, number)] = done_at
        if served_at is not None and number > first.get(name, (0,))[0]:
            first[name] = (number, done_at, served_at)
    out = []
    for name in sorted(routes):
        route = routes[name]
        served_done = completed.get((name, route.version))
        newest = first.get(name)
        out.append(
            Freshness(
                adapter=name,
                served_version=route.version,
                served_age_s=(None if served_done is None else (now - served_done).total_seconds()),
                first_served_version=newest[0] if newest else None,
                checkpoint_to_first_token_s=(
                    max(0.0, (newest[2] - newest[1]).total_seconds()) if newest else None
                ),
            )
        )
    return out


def fleet_freshness(fleet: Fleet, now: datetime) -> list[Freshness]:
    """Freshness of every routed adapter of `fleet` (one query; none without routes)."""
    routes = routes_of(fleet)
    if not routes:
        return []
    rows = (
        AdapterVersion.objects.filter(fleet_id=fleet.id, name__in=list(routes)[:MAX_NAMES])
        .order_by("-version")
        .values_list("name", "version", "completed_at", "first_served_at")[
            : MAX_NAMES * MAX_VERSIONS
        ]
    )
    return freshness(routes, rows, now)


def _version_json(row: AdapterVersion, copies: list[AdapterCopy]) -> dict[str, Any]:
    manifest = row.manifest if isinstance(row.manifest, dict) else {}
    return {
        "version": row.version,
        "state": row.state,
        "why": row.why,
        "digest": row.digest,
        "sizeBytes": row.size_bytes,
        "baseModel": row.base_model,
        "checkpoint": row.checkpoint,
        # Reported, never interpreted (steps, loss, the trainer's checkpoint name).
        "training": manifest.get("training") if isinstance(manifest.get("training"), dict) else {},
        "rank": manifest.get("rank"),
        "completedAt": _iso(row.completed_at),
        "registeredAt": _iso(row.registered_at),
        "firstServedAt": _iso(row.first_served_at),
        "copies": [
            {
                "domainId": str(c.domain_id),
                "domain": c.domain.slug,
                "state": c.state,
                "bytesStored": c.bytes_stored,
                "loadedAt": _iso(c.loaded_at),
                "probedAt": _iso(c.probed_at),
                "why": c.why,
            }
            for c in copies
        ],
    }


def _rollout_of(fleet_id: Id, name: str) -> dict[str, Any] | None:
    rollout = (
        Rollout.objects.filter(
            fleet_id=fleet_id,
            model=name,
            candidate__kind=ADAPTER_KIND,
            state__in=IN_FLIGHT_ROLLOUT_STATES,
        )
        .only("id", "state", "weight_permille", "candidate", "why")
        .first()
    )
    if rollout is None:
        return None
    return {
        "id": str(rollout.id),
        "state": rollout.state,
        "version": (rollout.candidate or {}).get("version"),
        "weightPermille": rollout.weight_permille,
        "why": rollout.why,
    }


def fleet_adapters(fleet: Fleet, now: datetime, *, name: str | None = None) -> list[dict[str, Any]]:
    """Every adapter name of `fleet` (or only `name`) with its newest versions, their copies,
    its route, its rollout in flight and its freshness; names in order."""
    routes = routes_of(fleet)
    names_query = AdapterVersion.objects.filter(fleet_id=fleet.id)
    if name is not None:
        names_query = names_query.filter(name=name)
    names = sorted(
        set(names_query.values_list("name", flat=True).distinct()[:MAX_NAMES])
        | ({name} & set(routes) if name is not None else set(routes))
    )[:MAX_NAMES]
    fresh = {f.adapter: f for f in fleet_freshness(fleet, now)}
    out = []
    for each in names:
        rows = list(
            AdapterVersion.objects.filter(fleet_id=fleet.id, name=each).order_by("-version")[
                :MAX_VERSIONS
            ]
        )
        copies: dict[Any, list[AdapterCopy]] = {}
        for c in (
            AdapterCopy.objects.filter(adapter__in=rows)
            .select_related("domain")
            .order_by("domain__slug")
        ):
            copies.setdefault(c.adapter_id, []).append(c)
        route = routes.get(each)
        out.append(
            {
                "name": each,
                "route": route.as_json() if route else None,
                "rollout": _rollout_of(fleet.id, each),
                "freshness": fresh[each].as_json() if each in fresh else None,
                "versions": [_version_json(r, copies.get(r.id, [])) for r in rows],
            }
        )
    return out


def adapter_get(fleet: Fleet, name: str, now: datetime) -> dict[str, Any]:
    """One adapter name of `fleet`; AdapterNotFound when neither the registry nor a route
    knows it."""
    found = fleet_adapters(fleet, now, name=name[:100])
    if not found:
        raise AdapterNotFound(f"adapter {name[:100]!r} not found in this fleet")
    return found[0]
