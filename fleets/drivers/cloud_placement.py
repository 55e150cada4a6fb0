"""A driver-backed domain's cloud placement and launch settings, checked before anything runs.

Pure: plain dicts in (the layout's `placement` and `driver` objects), frozen dataclasses out,
`CloudPlacementError` naming the first offending field otherwise. SkyPilot's own parser accepts
made-up regions and accelerators, so the names are checked here against `catalogue.json`.

"Cloud placement" is where a domain runs (cloud, regions, zones, accelerator); it is unrelated
to the placement of models on the GPUs of one domain (`fleets.core.placement`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from supervisor.strict_json import is_int

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")

# Bounds: SkyPilot takes any disk size, but a typo of 100000 GB is a bill, not a wish.
DISK_MIN_GB, DISK_MAX_GB = 50, 16_384
MAX_FALLBACK_REGIONS = 8
MAX_REPLICAS = 16
MAX_ENVS = 64
MAX_ENV_VALUE_CHARS = 4096
MAX_SETUP_CHARS = 16_384
MAX_SUPERVISOR_CONFIG_CHARS = 65_536
DEFAULT_SUPERVISOR_PORT = 8701
DEFAULT_READINESS_PATH = "/health"
STOP_MODES = ("down", "stop")
# The supervisor's credential: only ever a SkyPilot secret, never a plain env var in the YAML.
TOKEN_ENV = "HARU_SUPERVISOR_TOKEN"
# Variables the rendered task sets itself; an operator's `envs` must not shadow them.
RESERVED_ENVS = frozenset({TOKEN_ENV, "HARU_SUPERVISOR_CONFIG", "HARU_SUPERVISOR_HOST", "PORT"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)
_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,200}$")


class CloudPlacementError(ValueError):
    """A placement or driver setting Haru cannot launch; `path` names the field."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


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


def _known(value: object, choices, path: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CloudPlacementError(path, "must be a non-empty string")
    if value not in choices:
        listed = ", ".join(sorted(choices))
        raise CloudPlacementError(path, f"unknown {what} {value!r} (known: {listed})")
    return value


def _str_list(value: object, path: str, limit: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CloudPlacementError(path, "must be a list of strings")
    if len(value) > limit:
        raise CloudPlacementError(path, f"must have at most {limit} items")
    if len(set(value)) != len(value):
        raise CloudPlacementError(path, "must not repeat an entry")
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
_PLACEMENT_KEYS = frozenset(PLACEMENT_FIELDS)


def parse_cloud_placement(raw: object, *, path: str = "placement") -> CloudPlacement:
    """Validate a driver-backed domain's placement; raise CloudPlacementError naming the field."""
    if not isinstance(raw, Mapping):
        raise CloudPlacementError(path, "must be an object")
    for key in sorted(raw, key=str):
        if key not in _PLACEMENT_KEYS:
            raise CloudPlacementError(f"{path}.{key}", "unknown field")
    for key in ("cloud", "region", "accelerator"):
        if key not in raw:
            raise CloudPlacementError(f"{path}.{key}", "is required for a driver-backed domain")
    clouds = catalogue()
    cloud = _known(raw["cloud"], clouds, f"{path}.cloud", "cloud")
    known = clouds[cloud]
    region = _known(raw["region"], known["regions"], f"{path}.region", f"{cloud} region")
    zones = _str_list(raw.get("zones", []), f"{path}.zones", 16)
    for i, zone in enumerate(zones):
        _known(zone, known["regions"][region], f"{path}.zones[{i}]", f"zone of {region}")
    fallbacks = _str_list(
        raw.get("fallbackRegions", []), f"{path}.fallbackRegions", MAX_FALLBACK_REGIONS
    )
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
    if not is_int(count) or count not in allowed:
        counts = ", ".join(str(c) for c in allowed)
        raise CloudPlacementError(
            f"{path}.acceleratorCount",
            f"{cloud} sells {accelerator} in counts of {counts} per node, not {count!r}",
        )
    use_spot = raw.get("useSpot", False)
    if not isinstance(use_spot, bool):
        raise CloudPlacementError(f"{path}.useSpot", "must be true or false")
    disk = raw.get("diskSizeGb")
    if disk is not None and (not is_int(disk) or not DISK_MIN_GB <= disk <= DISK_MAX_GB):
        raise CloudPlacementError(
            f"{path}.diskSizeGb", f"must be an integer from {DISK_MIN_GB} to {DISK_MAX_GB}"
        )
    image = raw.get("image")
    if image is not None and (
        not isinstance(image, str) or not re.match(known["imagePattern"], image)
    ):
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


_DRIVER_KEYS = frozenset(
    {
        "supervisorConfig",
        "supervisorPort",
        "servingPort",
        "supervisorCommand",
        "setup",
        "envs",
        "stopMode",
        "replicas",
        "readinessPath",
    }
)


def _port(value: object, path: str) -> int:
    # Below 1024 needs root on the node; SkyPilot's own ports sit above 10000 only by habit.
    if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 65535:
        raise CloudPlacementError(path, "must be a port number from 1024 to 65535")
    return value


def _envs(raw: object, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise CloudPlacementError(path, "must be an object of NAME: value strings")
    if len(raw) > MAX_ENVS:
        raise CloudPlacementError(path, f"must have at most {MAX_ENVS} entries")
    out = []
    for name in sorted(raw, key=str):
        where = f"{path}.{name}"
        if not isinstance(name, str) or not _ENV_NAME.match(name):
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
        value = raw[name]
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE_CHARS:
            raise CloudPlacementError(where, f"must be a string of at most {MAX_ENV_VALUE_CHARS}")
        out.append((name, value))
    return tuple(out)


def parse_driver_settings(raw: object, *, provider: str, path: str = "driver") -> DriverSettings:
    """Validate a driver-backed domain's `driver` object for `provider`."""
    if not isinstance(raw, Mapping):
        raise CloudPlacementError(path, "must be an object (required for a driver-backed domain)")
    for key in sorted(raw, key=str):
        if key not in _DRIVER_KEYS:
            raise CloudPlacementError(f"{path}.{key}", "unknown field")
    config = raw.get("supervisorConfig")
    if not isinstance(config, Mapping) or not isinstance(config.get("slots"), list):
        raise CloudPlacementError(
            f"{path}.supervisorConfig", "is required: the supervisor config (with its slots)"
        )
    if len(json.dumps(config)) > MAX_SUPERVISOR_CONFIG_CHARS:
        raise CloudPlacementError(
            f"{path}.supervisorConfig", f"must be at most {MAX_SUPERVISOR_CONFIG_CHARS} characters"
        )
    if TOKEN_ENV.lower() in json.dumps(config).lower() or "token" in {k.lower() for k in config}:
        raise CloudPlacementError(
            f"{path}.supervisorConfig", "must not carry the supervisor token (Haru passes it)"
        )
    sup_port = _port(raw.get("supervisorPort", DEFAULT_SUPERVISOR_PORT), f"{path}.supervisorPort")
    serving = raw.get("servingPort")
    serving_port = None if serving is None else _port(serving, f"{path}.servingPort")
    if serving_port is not None and serving_port == sup_port:
        raise CloudPlacementError(f"{path}.servingPort", "must differ from supervisorPort")
    if provider == "skyserve" and serving_port is None:
        raise CloudPlacementError(
            f"{path}.servingPort", "is required for skyserve (the service's replica port)"
        )
    command = raw.get("supervisorCommand", "python3 -m supervisor")
    if not isinstance(command, str) or not command.strip() or "\n" in command:
        raise CloudPlacementError(f"{path}.supervisorCommand", "must be one non-empty line")
    setup = raw.get("setup", "")
    if not isinstance(setup, str) or len(setup) > MAX_SETUP_CHARS:
        raise CloudPlacementError(f"{path}.setup", f"must be a string of at most {MAX_SETUP_CHARS}")
    stop_mode = raw.get("stopMode")
    if stop_mode is not None and stop_mode not in STOP_MODES:
        raise CloudPlacementError(f"{path}.stopMode", 'must be "down" or "stop"')
    replicas = raw.get("replicas", 1)
    if not is_int(replicas) or not 1 <= replicas <= MAX_REPLICAS:
        raise CloudPlacementError(
            f"{path}.replicas", f"must be an integer from 1 to {MAX_REPLICAS}"
        )
    if provider != "skyserve" and replicas != 1:
        raise CloudPlacementError(f"{path}.replicas", "only a skyserve domain has replicas")
    readiness = raw.get("readinessPath", DEFAULT_READINESS_PATH)
    if not isinstance(readiness, str) or not _PATH.match(readiness):
        raise CloudPlacementError(f"{path}.readinessPath", "must be an absolute URL path")
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
