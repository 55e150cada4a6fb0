"""Which hosts the fleet farm (supervisor/farm) plays: names, ports and tokens, in a manifest.

The manifest is the one file both sides share: the farm serves what it lists, and the control
plane's seeding (haru/local/farm_fleets.py) writes the layouts pointing at it. A token is either
given (the control plane derives one per domain from its master key) or drawn here.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.ports import free_port

# The models every farm host serves, as the local launcher's simulated hosts do.
MODELS = ("llama-small", "qwen-small")
# A manifest larger than this is not one the farm wrote (2,000 hosts take about 600 KB).
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_HOSTS = 10_000


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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serving_url(self, model: str) -> str:
        port = next(m.port for m in self.models if m.name == model)
        return f"http://127.0.0.1:{port}"

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
        )


def random_token() -> str:
    """A token fit for a supervisor (43 URL-safe characters, as a derived one)."""
    return secrets.token_urlsafe(32)


def plan_hosts(
    count: int,
    *,
    prefix: str = "h",
    models: Iterable[str] = MODELS,
    token_for: Callable[[str], str] | None = None,
    asleep: Callable[[int], bool] | None = None,
) -> list[HostPlan]:
    """Plan `count` hosts named `<prefix>0000`..., each on free loopback ports."""
    if not 0 < count <= MAX_HOSTS:
        raise ValueError(f"hosts must be 1 to {MAX_HOSTS}, got {count}")
    names = tuple(models)
    token_for = token_for or (lambda _name: random_token())
    plans = []
    for i in range(count):
        name = f"{prefix}{i:04d}"
        plans.append(
            HostPlan(
                name=name,
                port=free_port(),
                token=token_for(name),
                models=tuple(ModelPlan(m, free_port()) for m in names),
                asleep=asleep(i) if asleep else False,
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
