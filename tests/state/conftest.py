"""Fixtures for the state-store tests: a three-domain variant of the demo fleet."""

from __future__ import annotations

import copy

import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.services.layouts import layout_apply


def three_domain_layout(two_domain: dict) -> dict:
    """Return the demo layout plus a third static, promotable domain `north`."""
    data = copy.deepcopy(two_domain)
    north = copy.deepcopy(data["domains"][1])
    north.update(
        slug="north",
        displayName="eu-north-1 (simulated H100)",
        priority=30,
        supervisorUrl="http://127.0.0.1:8703",
        servingBaseUrl="http://127.0.0.1:18021",
    )
    north["placement"]["region"] = "eu-north-1"
    north["slots"][0]["models"] = [
        {"name": "llama-small", "servingUrl": "http://127.0.0.1:18022", "memoryMiB": 8960},
        {"name": "qwen-small", "servingUrl": "http://127.0.0.1:18021", "memoryMiB": 6912},
    ]
    north["slots"][1]["checkpointDir"] = "var/checkpoints/north"
    data["domains"].append(north)
    return data


@pytest.fixture
def three_domain_data(layout_data):
    return three_domain_layout(layout_data)


@pytest.fixture
def apply_layout():
    """Return a function that applies a layout dict and returns its Fleet."""

    def apply(data: dict):
        layout_apply(layout=parse_layout(data))
        return Fleet.objects.get(slug=data["slug"])

    return apply


@pytest.fixture
def three_domain_fleet(db, three_domain_data, apply_layout):
    return apply_layout(three_domain_data)
