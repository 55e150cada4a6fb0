"""Which hosts the fleet farm (supervisor/farm) plays: names, ports and tokens, in a manifest.

The manifest is the one file both sides share: the farm serves what it lists, and the control
plane's seeding (haru/local/farm_fleets.py) writes the layouts pointing at it. A token is either
given (the control plane derives one per domain from its master key) or drawn here.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import secrets
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.ports import candidates

# The models every farm host serves, as the local launcher's simulated hosts do.
MODELS = ("llama-small", "qwen-small")
# A manifest larger than this is not one the farm wrote (2,000 hosts take about 600 KB).
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
# Three ports per host, in a row from the free-port range (12,768 ports on Linux's defaults).
MAX_HOSTS = 4_000


@dataclass(frozen=True)
class ModelPlan:
    name: str
    port: int


@dataclass(frozen=True)
class HostPlan:
    """One simulated host: its supervisor's port and token, and its model servers."""

    name: str
    port: int
    token: str = field(repr=False)
    models: tuple[ModelPlan, ...]
    # Starts with its models asleep (a standby's posture).
    asleep: bool = False
    # The loopback address the host listens on (see `farm_address`).
    address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def serving_url(self, model: str) -> str:
        port = next(m.port for m in self.models if m.name == model)
        return f"http://{self.address}:{port}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "models": [asdict(m) for m in self.models]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostPlan:
        return cls(
            name=str(data["name"]),
            port=int(data["port"]),
            token=str(data["token"]),
            models=tuple(ModelPlan(str(m["name"]), int(m["port"])) for m in data["models"]),
            asleep=bool(data.get("asleep", False)),
            address=_loopback(str(data.get("address", "127.0.0.1"))),
        )


def random_token() -> str:
    """A token fit for a supervisor (43 URL-safe characters, as a derived one)."""
    return secrets.token_urlsafe(32)


def _loopback(address: str) -> str:
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"{address} is not a loopback address: the farm listens on loopback only")
    return address


def farm_address() -> str:
    """A loopback address of the farm's own, drawn from 127.0.0.0/8 beyond 127.0.0.x.

    Linux routes all of 127/8 to the loopback interface, so a farm listening on an address of its
    own cannot collide with the servers everybody else starts on 127.0.0.1 (whose free ports
    come from the same range as the farm's): its ports are taken in a row, nothing probed.
    """
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def plan_hosts(
    count: int,
    *,
    prefix: str = "h",
    models: Iterable[str] = MODELS,
    token_for: Callable[[str], str] | None = None,
    asleep: Callable[[int], bool] | None = None,
) -> list[HostPlan]:
    """Plan `count` hosts named `<prefix>0000`..., on one loopback address of the farm's own
    (`farm_address`), each supervisor and model server on the next port in a row."""
    if not 0 < count <= MAX_HOSTS:
        raise ValueError(f"hosts must be 1 to {MAX_HOSTS}, got {count}")
    names = tuple(models)
    ports = iter(candidates())
    token_for = token_for or (lambda _name: random_token())
    address = farm_address()
    plans = []
    for i in range(count):
        name = f"{prefix}{i:04d}"
        plans.append(
            HostPlan(
                name=name,
                port=next(ports),
                token=token_for(name),
                models=tuple(ModelPlan(m, next(ports)) for m in names),
                asleep=asleep(i) if asleep else False,
                address=address,
            )
        )
    return plans


def write_manifest(path: Path, hosts: Iterable[HostPlan]) -> None:
    """Write the manifest readable by its owner only: it holds every host's token."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"hosts": [h.to_json() for h in hosts]}, f)
    tmp.replace(path)


def read_manifest(path: Path) -> list[HostPlan]:
    """Read a manifest; raise ValueError naming what is wrong with it."""
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than a farm manifest holds")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        hosts = [HostPlan.from_json(h) for h in data["hosts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a farm manifest ({exc!r})") from exc
    if not 0 < len(hosts) <= MAX_HOSTS:
        raise ValueError(f"{path}: {len(hosts)} hosts (1 to {MAX_HOSTS})")
    return hosts
