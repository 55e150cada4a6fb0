"""A driver-backed domain's placement and launch settings: structure in JSON Schema files,
checked strictly and reported all at once; the catalogue and cross-field rules stay in Python."""

from __future__ import annotations

import json

import pytest

from common import limits
from common.documents import schema_validator
from fleets.drivers.cloud_placement import (
    PLACEMENT_FIELDS,
    CloudPlacementError,
    parse_cloud_placement,
    parse_driver_settings,
)
from fleets.layouts.loader import SCHEMA_PATH

BASE = {"cloud": "aws", "region": "us-east-1", "accelerator": "H100"}
CONFIG = {"slots": []}


def _schema(name: str) -> dict:
    return schema_validator("fleets.drivers", name).schema


def test_the_placement_fields_are_the_schemas_in_the_layout_formats_order():
    assert tuple(_schema("placement")["properties"]) == PLACEMENT_FIELDS
    layout = json.loads(SCHEMA_PATH.read_text())["$defs"]["placement"]["properties"]
    assert set(layout) == set(PLACEMENT_FIELDS)


def test_the_launchable_placement_bounds_its_lists_and_image_as_the_layout_does():
    layout = json.loads(SCHEMA_PATH.read_text())["$defs"]["placement"]["properties"]
    launchable = _schema("placement")["properties"]
    for field in ("zones", "fallbackRegions"):
        assert launchable[field]["maxItems"] == layout[field]["maxItems"]
    assert launchable["image"]["maxLength"] == layout["image"]["maxLength"]


def test_the_port_limit_is_the_shared_one():
    port = _schema("driver")["properties"]["supervisorPort"]
    assert port["maximum"] == limits.MAX_PORT
    with pytest.raises(CloudPlacementError) as err:
        parse_driver_settings(
            {"supervisorConfig": CONFIG, "supervisorPort": limits.MAX_PORT + 1}, provider="skypilot"
        )
    assert err.value.rule == f"must be a port number from 1024 to {limits.MAX_PORT}"


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({**BASE, "acceleratorCount": 2.0}, "placement.acceleratorCount"),
        ({**BASE, "diskSizeGb": 100.0}, "placement.diskSizeGb"),
    ],
)
def test_a_whole_float_is_not_an_integer_in_a_placement(raw, path):
    with pytest.raises(CloudPlacementError) as err:
        parse_cloud_placement(raw)
    assert err.value.path == path


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"supervisorPort": 8701.0}, "driver.supervisorPort"),
        ({"servingPort": True}, "driver.servingPort"),
        ({"servingPort": 8000, "replicas": 2.0}, "driver.replicas"),
    ],
)
def test_a_whole_float_or_a_bool_is_not_a_port_or_a_replica_count(extra, path):
    with pytest.raises(CloudPlacementError) as err:
        parse_driver_settings({"supervisorConfig": CONFIG, **extra}, provider="skyserve")
    assert err.value.path == path


@pytest.mark.parametrize("command", ["python3 -m supervisor\n", "   ", ""])
def test_a_supervisor_command_must_be_one_non_empty_line(command):
    with pytest.raises(CloudPlacementError) as err:
        parse_driver_settings(
            {"supervisorConfig": CONFIG, "supervisorCommand": command}, provider="skypilot"
        )
    assert (err.value.path, err.value.rule) == (
        "driver.supervisorCommand",
        "must be one non-empty line",
    )


def test_the_supervisor_command_is_kept_without_its_surrounding_blanks():
    settings = parse_driver_settings(
        {"supervisorConfig": CONFIG, "supervisorCommand": "  python3 -m supervisor "},
        provider="skypilot",
    )
    assert settings.supervisor_command == "python3 -m supervisor"


def test_every_structural_problem_is_reported_at_once_the_first_in_the_message():
    with pytest.raises(CloudPlacementError) as err:
        parse_driver_settings(
            {"supervisorConfig": CONFIG, "colour": 1, "replicas": 0, "envs": {"A": 1}},
            provider="skyserve",
        )
    assert err.value.messages == [
        "driver.colour: unknown field",
        'driver.envs: value of "A" must be a string of at most 4096',
        "driver.replicas: must be an integer from 1 to 16",
    ]
    assert str(err.value) == err.value.messages[0]
