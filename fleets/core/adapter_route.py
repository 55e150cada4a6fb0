"""Which adapter version answers a request for an adapter's name: the fleet's adapter routes.

Clients ask for an adapter by its name (`support-bot`), as the `model` of a chat request. The
engine never serves that name: each registered version is loaded under its own concrete name
(`support-bot@v7`, common/adapter_manifest.engine_name), so a reload can never serve weights a
name once meant. The fleet's adapter routes (`Fleet.adapter_routes`) say, per adapter name,
which version serves, and during an adapter rollout the share of requests its candidate gets:

    {"base": "<served model name>", "version": 7, "candidate": 8 | null,
     "weightPermille": 0..1000, "rollout": "<uuid>" | null, "stickyHeader": "" | "<name>",
     "pinned": false}

`version` is what the route names; `candidate` is a newer (or, for a pinned rollback, any
other) version taking `weightPermille` of the requests, chosen sticky per caller exactly as a
domain split chooses (fleets/core/route_split.bucket, salted with the rollout id). Moved only
with the route revision by `fleets.services.adapter_routes` (one compare-and-swap); a pointer
move keeps them (the standby holds the same versions, probed before the route moves). A
rollback is one such write: the candidate and its weight go, the version stays.

Pure: no ORM.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from common.adapter_manifest import engine_name, name_valid
from fleets.core.arm_stats import Arm
from fleets.core.route_split import _HEADER, PERMILLE, bucket

_KEYS = {"base", "version", "candidate", "weightPermille", "rollout", "stickyHeader", "pinned"}
# A fleet serves few adapters at once; this bounds what one row may hold.
MAX_ADAPTER_ROUTES = 64
MAX_VERSION = 10**9


class AdapterRouteInvalid(ValueError):
    """A stored or requested adapter route the router refuses (the message names the field)."""


@dataclass(frozen=True)
class AdapterRoute:
    """One adapter name's route: its base model, the version it names, and its candidate."""

    base: str
    version: int
    candidate: int | None = None
    weight_permille: int = 0
    rollout_id: str | None = None
    sticky_header: str = ""
    pinned: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "version": self.version,
            "candidate": self.candidate,
            "weightPermille": self.weight_permille,
            "rollout": self.rollout_id,
            "stickyHeader": self.sticky_header,
            "pinned": self.pinned,
        }

    def versions(self) -> tuple[int, ...]:
        """Every version this route may send a request to (what each domain must hold)."""
        return (self.version,) if self.candidate is None else (self.version, self.candidate)

    def rolled_back(self) -> AdapterRoute:
        """The route after a rollback: the version it names, alone."""
        return replace(self, candidate=None, weight_permille=0, rollout_id=None)


def _version(raw: Any, where: str, *, optional: bool = False) -> int | None:
    if raw is None and optional:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_VERSION:
        raise AdapterRouteInvalid(f"{where} must be a version number from 1")
    return int(raw)


def adapter_route_parse(raw: Any, *, name: str = "") -> AdapterRoute:
    """Read one stored route; raise AdapterRouteInvalid naming the field at fault."""
    where = f"adapter route {name!r}: " if name else ""
    if not isinstance(raw, Mapping):
        raise AdapterRouteInvalid(f"{where}must be an object")
    unknown = set(raw) - _KEYS
    if unknown:
        raise AdapterRouteInvalid(f"{where}unknown keys {sorted(unknown)}")
    base = raw.get("base")
    if not isinstance(base, str) or not base or len(base) > 200:
        raise AdapterRouteInvalid(f"{where}base must name the served model")
    version = _version(raw.get("version"), f"{where}version")
    candidate = _version(raw.get("candidate"), f"{where}candidate", optional=True)
    if candidate is not None and candidate == version:
        raise AdapterRouteInvalid(f"{where}candidate must differ from version")
    weight = raw.get("weightPermille", 0)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= PERMILLE:
        raise AdapterRouteInvalid(f"{where}weightPermille must be an integer from 0 to {PERMILLE}")
    if candidate is None and weight:
        raise AdapterRouteInvalid(f"{where}weightPermille must be 0 without a candidate")
    rollout = raw.get("rollout")
    if rollout is not None:
        try:
            rollout = str(uuid.UUID(str(rollout)))
        except ValueError:
            raise AdapterRouteInvalid(f"{where}rollout must be a UUID or null") from None
    header = raw.get("stickyHeader", "")
    if not isinstance(header, str) or (header and not _HEADER.match(header)):
        raise AdapterRouteInvalid(f"{where}stickyHeader must be a lower-case header name or empty")
    pinned = raw.get("pinned", False)
    if not isinstance(pinned, bool):
        raise AdapterRouteInvalid(f"{where}pinned must be true or false")
    assert version is not None
    return AdapterRoute(base, version, candidate, weight, rollout, header, pinned)


def adapter_routes_parse(raw: Any) -> dict[str, AdapterRoute]:
    """Read a fleet's `adapter_routes`; raise AdapterRouteInvalid on anything to refuse."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, Mapping):
        raise AdapterRouteInvalid("adapter routes must be an object")
    if len(raw) > MAX_ADAPTER_ROUTES:
        raise AdapterRouteInvalid(f"at most {MAX_ADAPTER_ROUTES} adapter routes")
    routes = {}
    for name, value in raw.items():
        if not name_valid(name):
            raise AdapterRouteInvalid(f"adapter route name {name!r} is not an adapter name")
        routes[name] = adapter_route_parse(value, name=name)
    return routes


def adapter_routes_dump(routes: Mapping[str, AdapterRoute]) -> dict[str, dict[str, Any]]:
    return {name: route.as_json() for name, route in sorted(routes.items())}


def choose_version(
    route: AdapterRoute, key: str | None, rng: random.Random | None = None
) -> tuple[int, Arm]:
    """The version a request with stickiness `key` (None: none) gets, and its arm.

    The same draw as a domain split (route_split.bucket salted with the rollout id): one
    caller sees one version for as long as the weight does not move past them.
    """
    if route.candidate is None or route.weight_permille <= 0:
        return route.version, Arm.STABLE
    if route.weight_permille >= PERMILLE:
        return route.candidate, Arm.CANDIDATE
    salt = route.rollout_id or f"{route.base}:{route.version}:{route.candidate}"
    draw = bucket(salt, key) if key else (rng or random).randrange(PERMILLE)
    if draw < route.weight_permille:
        return route.candidate, Arm.CANDIDATE
    return route.version, Arm.STABLE


def concrete_name(name: str, version: int) -> str:
    """The engine's name for `version` of adapter `name` (common/adapter_manifest)."""
    return engine_name(name, version)
