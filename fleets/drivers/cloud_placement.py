"""A driver-backed domain's cloud placement and launch settings, checked before anything runs.

Pure: plain dicts in (the layout's `placement` and `driver` objects), frozen dataclasses out,
`CloudPlacementError` naming the offending field otherwise. The structure (fields, types,
bounds) is two JSON Schema files, `schemas/placement.json` and `schemas/driver.json`, checked
through `common/documents.py` like every operator document; this module keeps what a schema
cannot say. SkyPilot's own parser accepts made-up regions and accelerators, so the names are
checked here against `catalogue.json`, with what depends on the provider or on other fields.

"Cloud placement" is where a domain runs (cloud, regions, zones, accelerator); it is unrelated
to the placement of models on the GPUs of one domain (`fleets.core.placement`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

from fleets.drivers.base import (
    TLS_ENVS,
    TOKEN_ENV,
    DriverSettingsError,
    check_envs,
    check_structure,
    check_supervisor_config,
)

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")

DEFAULT_SUPERVISOR_PORT = 8701
DEFAULT_READINESS_PATH = "/health"
# Variables the rendered task sets itself; an operator's `envs` must not shadow them.
RESERVED_ENVS = frozenset(
    {TOKEN_ENV, "HARU_SUPERVISOR_CONFIG", "HARU_SUPERVISOR_HOST", "PORT", *TLS_ENVS}
)


class CloudPlacementError(DriverSettingsError):
    """A SkyPilot/SkyServe placement or driver setting Haru cannot launch; `path` names it."""


def _check_structure(name: str, raw: object, path: str) -> None:
    try:
        check_structure(name, raw, path)
    except DriverSettingsError as exc:
        raise CloudPlacementError(exc.path, exc.rule, also=exc.problems[1:]) from None


@dataclass(frozen=True)
class Candidate:
    """One place to try a launch: a region, optionally pinned to one zone."""

    region: str
    zone: str | None = None

    def label(self) -> str:
        return f"{self.region}/{self.zone}" if self.zone else self.region


@dataclass(frozen=True)
class CloudPlacement:
    cloud: str
    region: str
    zones: tuple[str, ...]
    fallback_regions: tuple[str, ...]
    accelerator: str
    accelerator_count: int
    use_spot: bool
    disk_size_gb: int | None
    image: str | None

    def candidates(self) -> tuple[Candidate, ...]:
        """Return every place to try, in order: the region's zones (or the region), then each
        fallback region (any zone)."""
        first = tuple(Candidate(self.region, z) for z in self.zones) or (Candidate(self.region),)
        return first + tuple(Candidate(r) for r in self.fallback_regions)


@dataclass(frozen=True)
class DriverSettings:
    """How the domain's supervisor is started on the cluster."""

    supervisor_config: dict[str, Any]
    supervisor_port: int
    serving_port: int | None
    supervisor_command: str
    setup: str
    envs: tuple[tuple[str, str], ...]
    stop_mode: str | None  # None: the fleet policy decides
    replicas: int
    readiness_path: str


@cache
def catalogue() -> dict[str, Any]:
    """Return the clouds, regions, zones and accelerators Haru knows (catalogue.json)."""
    return json.loads(CATALOGUE_PATH.read_text())["clouds"]


def _known(value: str, choices: Iterable[str], path: str, what: str) -> str:
    if value not in choices:
        listed = ", ".join(sorted(choices))
        raise CloudPlacementError(path, f"unknown {what} {value!r} (known: {listed})")
    return value


# A domain's placement fields, in the layout format's own order (the exporter writes them so).
PLACEMENT_FIELDS = (
    "cloud",
    "region",
    "zones",
    "fallbackRegions",
    "accelerator",
    "acceleratorCount",
    "useSpot",
    "diskSizeGb",
    "image",
)


def parse_cloud_placement(raw: object, *, path: str = "placement") -> CloudPlacement:
    """Validate a driver-backed domain's placement; raise CloudPlacementError naming the field."""
    _check_structure("placement", raw, path)
    raw = cast(Mapping[str, Any], raw)  # an object: the schema said so
    clouds = catalogue()
    cloud = _known(raw["cloud"], clouds, f"{path}.cloud", "cloud")
    known = clouds[cloud]
    region = _known(raw["region"], known["regions"], f"{path}.region", f"{cloud} region")
    zones = raw.get("zones", [])
    for i, zone in enumerate(zones):
        _known(zone, known["regions"][region], f"{path}.zones[{i}]", f"zone of {region}")
    fallbacks = raw.get("fallbackRegions", [])
    for i, other in enumerate(fallbacks):
        where = f"{path}.fallbackRegions[{i}]"
        _known(other, known["regions"], where, f"{cloud} region")
        if other == region:
            raise CloudPlacementError(where, "repeats the primary region")
    accelerator = _known(
        raw["accelerator"], known["accelerators"], f"{path}.accelerator", f"{cloud} accelerator"
    )
    count = raw.get("acceleratorCount", 1)
    allowed = known["accelerators"][accelerator]
    if count not in allowed:
        counts = ", ".join(str(c) for c in allowed)
        raise CloudPlacementError(
            f"{path}.acceleratorCount",
            f"{cloud} sells {accelerator} in counts of {counts} per node, not {count!r}",
        )
    use_spot = raw.get("useSpot", False)
    disk = raw.get("diskSizeGb")
    image = raw.get("image")
    if image is not None and not re.match(known["imagePattern"], image):
        raise CloudPlacementError(f"{path}.image", known["imageRule"])
    return CloudPlacement(
        cloud=cloud,
        region=region,
        zones=tuple(zones),
        fallback_regions=tuple(fallbacks),
        accelerator=accelerator,
        accelerator_count=int(count),
        use_spot=use_spot,
        disk_size_gb=disk,
        image=image,
    )


def parse_driver_settings(raw: object, *, provider: str, path: str = "driver") -> DriverSettings:
    """Validate a driver-backed domain's `driver` object for `provider`."""
    _check_structure("driver", raw, path)
    raw = cast(Mapping[str, Any], raw)  # an object: the schema said so
    try:
        config = check_supervisor_config(raw["supervisorConfig"], f"{path}.supervisorConfig")
        envs = check_envs(raw.get("envs", {}), f"{path}.envs", reserved=RESERVED_ENVS.__contains__)
    except DriverSettingsError as exc:
        raise CloudPlacementError(exc.path, exc.rule) from None
    sup_port = raw.get("supervisorPort", DEFAULT_SUPERVISOR_PORT)
    serving_port = raw.get("servingPort")
    if serving_port is not None and serving_port == sup_port:
        raise CloudPlacementError(f"{path}.servingPort", "must differ from supervisorPort")
    if provider == "skyserve" and serving_port is None:
        raise CloudPlacementError(
            f"{path}.servingPort", "is required for skyserve (the service's replica port)"
        )
    command = raw.get("supervisorCommand", "python3 -m supervisor")
    setup = raw.get("setup", "")
    stop_mode = raw.get("stopMode")
    replicas = raw.get("replicas", 1)
    if provider != "skyserve" and replicas != 1:
        raise CloudPlacementError(f"{path}.replicas", "only a skyserve domain has replicas")
    readiness = raw.get("readinessPath", DEFAULT_READINESS_PATH)
    return DriverSettings(
        supervisor_config=config,
        supervisor_port=sup_port,
        serving_port=serving_port,
        supervisor_command=command.strip(),
        setup=setup,
        envs=envs,
        stop_mode=stop_mode,
        replicas=int(replicas),
        readiness_path=readiness,
    )
