"""The driver registry: what a layout may name as a domain's provider, and the shape every
driver's name must have to be stored."""

from __future__ import annotations

import re

import pytest

from common.limits import MAX_DRIVER_CALL_S
from fleets.drivers import script, sky_cli
from fleets.drivers.base import ProvisioningDriver
from fleets.drivers.registry import (
    DriverRegistry,
    UnknownDriver,
    builtin,
    default_registry,
    provider_names,
)
from fleets.drivers.script import ScriptDriver
from fleets.layouts.loader import layout_schema
from fleets.models import PROVIDER_REGEX
from fleets.reconciler.provision import PROVISION_LEASE_S


def test_the_built_in_drivers_are_registered_by_name():
    assert builtin().names() == ("script", "skypilot", "skyserve")
    assert provider_names() == ("static", "script", "skypilot", "skyserve")
    for name in builtin().names():
        driver = builtin().get(name)
        assert isinstance(driver, ProvisioningDriver) and driver.name == name


def test_an_unknown_driver_is_refused_naming_the_known_ones():
    with pytest.raises(UnknownDriver, match='unknown driver "ipmi" \\(known: script, skypilot'):
        builtin().get("ipmi")


def test_a_later_driver_of_the_same_name_replaces_the_earlier():
    replacement = ScriptDriver(environ={})
    registry = DriverRegistry([ScriptDriver(), replacement])
    assert registry.get("script") is replacement


def test_every_driver_name_fits_the_stored_shape_and_the_layout_schema():
    pattern = layout_schema()["$defs"]["domain"]["properties"]["provider"]["pattern"]
    assert pattern == PROVIDER_REGEX
    for name in provider_names():
        assert re.fullmatch(PROVIDER_REGEX, name), name


def test_the_sky_cli_is_made_only_when_a_driver_calls_it():
    made: list[str] = []

    def sky():
        made.append("sky")
        raise AssertionError("not here")

    registry = default_registry(sky=sky)
    registry.get("skypilot").validate(
        placement={"cloud": "aws", "region": "us-east-1", "accelerator": "H100"},
        settings={"supervisorConfig": {"slots": []}},
    )
    assert made == []


def test_a_domains_worst_pass_fits_in_the_provisioning_lease():
    """A pass renews its lease per domain and makes at most two driver calls for one domain
    (stop, then describe); every call's deadline is at most MAX_DRIVER_CALL_S."""
    assert 2 * MAX_DRIVER_CALL_S < PROVISION_LEASE_S
    assert max(sky_cli.DEFAULT_TIMEOUT_S, sky_cli.STATUS_TIMEOUT_S) <= MAX_DRIVER_CALL_S
    assert max(script.DEFAULT_TIMEOUT_S.values()) <= MAX_DRIVER_CALL_S
