"""The registry of provisioning drivers, by the name a layout gives as a domain's `provider`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from fleets.drivers.base import ProvisioningDriver
from fleets.drivers.script import ScriptDriver
from fleets.drivers.sky_cli import SkyCli
from fleets.drivers.skypilot import SkyPilotDriver
from fleets.drivers.skyserve import SkyServeDriver

# The provider of a domain no driver provisions: it heartbeats the URLs its layout gives.
STATIC = "static"


class UnknownDriver(KeyError):
    """No driver is registered under that name."""


class DriverRegistry:
    """The drivers by name; of two with one name, the later wins."""

    def __init__(self, drivers: list[ProvisioningDriver]) -> None:
        self._drivers = {driver.name: driver for driver in drivers}

    def get(self, name: str) -> ProvisioningDriver:
        if name not in self._drivers:
            known = ", ".join(self.names())
            raise UnknownDriver(f'unknown driver "{name}" (known: {known})')
        return self._drivers[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._drivers))


def default_registry(
    *, config: Mapping[str, Any] | None = None, sky: Callable[[], SkyCli] | None = None
) -> DriverRegistry:
    """Return a registry with the built-in drivers. `config` is Haru's settings (each driver
    reads its own keys: `sky_venv`); `sky`, when given, makes the `sky` CLI instead (tests)."""
    venv = (config or {}).get("sky_venv")
    sky = sky or (lambda: SkyCli(venv=venv))
    return DriverRegistry([SkyPilotDriver(sky), SkyServeDriver(sky), ScriptDriver()])


@cache
def builtin() -> DriverRegistry:
    """The built-in drivers, for validating settings (nothing is launched through these)."""
    return default_registry()


def provider_names() -> tuple[str, ...]:
    """Every provider a layout may name: static, then each driver."""
    return (STATIC, *builtin().names())
