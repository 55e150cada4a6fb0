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

from common.documents import problems, schema_validator

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")

MAX_SUPERVISOR_CONFIG_CHARS = 65_536
DEFAULT_SUPERVISOR_PORT = 8701
DEFAULT_READINESS_PATH = "/health"
# The supervisor's credential: only ever a SkyPilot secret, never a plain env var in the YAML.
TOKEN_ENV = "HARU_SUPERVISOR_TOKEN"
# Variables the rendered task sets itself; an operator's `envs` must not shadow them.
RESERVED_ENVS = frozenset({TOKEN_ENV, "HARU_SUPERVISOR_CONFIG", "HARU_SUPERVISOR_HOST", "PORT"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)


class CloudPlacementError(ValueError):
    """A placement or driver setting Haru cannot launch; `path` names the field.

    `problems` holds every (path, rule) found, this one first: the schema reports all of a
    document's structural problems at once, a semantic rule the first it meets.
    """

    def __init__(self, path: str, rule: str, *, also: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule
        self.problems = [(path, rule), *also]

    @property
    def messages(self) -> list[str]:
        """Every problem as a `path: rule` line."""
        return [f"{where}: {rule}" for where, rule in self.problems]


def _check_structure(name: str, raw: object, path: str) -> None:
    """Raise CloudPlacementError with every way `raw` breaks `schemas/<name>.json`."""
    found = problems(schema_validator(__package__, name), raw, path)
    if found:
        (where, rule), *rest = found
        raise CloudPlacementError(where, rule, also=rest)


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


def _envs(raw: Mapping[str, str], path: str) -> tuple[tuple[str, str], ...]:
    out = []
    for name in sorted(raw):
        where = f"{path}.{name}"
        if not _ENV_NAME.match(name):
            raise CloudPlacementError(where, "must be an environment variable name")
        if name in RESERVED_ENVS:
            raise CloudPlacementError(where, "is set by Haru itself")
        if _SECRETISH.search(name):
            # envs land in the task YAML in plain text; credentials must not.
            raise CloudPlacementError(
                where,
                "looks like a credential; envs are written in plain text, so keep "
                "credentials in the cloud's secret store or the image",
            )
        out.append((name, raw[name]))
    return tuple(out)


def parse_driver_settings(raw: object, *, provider: str, path: str = "driver") -> DriverSettings:
    """Validate a driver-backed domain's `driver` object for `provider`."""
    _check_structure("driver", raw, path)
    raw = cast(Mapping[str, Any], raw)  # an object: the schema said so
    config = raw["supervisorConfig"]
    text = json.dumps(config)
    if len(text) > MAX_SUPERVISOR_CONFIG_CHARS:
        raise CloudPlacementError(
            f"{path}.supervisorConfig", f"must be at most {MAX_SUPERVISOR_CONFIG_CHARS} characters"
        )
    if TOKEN_ENV.lower() in text.lower() or "token" in {k.lower() for k in config}:
        raise CloudPlacementError(
            f"{path}.supervisorConfig", "must not carry the supervisor token (Haru passes it)"
        )
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
        supervisor_config=json.loads(json.dumps(config)),
        supervisor_port=sup_port,
        serving_port=serving_port,
        supervisor_command=command.strip(),
        setup=setup,
        envs=_envs(raw.get("envs", {}), f"{path}.envs"),
        stop_mode=stop_mode,
        replicas=int(replicas),
        readiness_path=readiness,
    )
