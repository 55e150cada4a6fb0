"""A small fleet for tests: a static active (east) and a Haru-provisioned standby (west)."""

from __future__ import annotations

import copy

from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.services.layouts import layout_apply

SUPERVISOR_CONFIG = {
    "host": "west",
    "gpu": {"backend": "sim", "simStateFile": "var/sim-gpu.json"},
    "slots": [
        {
            "kind": "inference",
            "gpuIndex": 0,
            "models": [{"name": "qwen-small", "port": 18001, "profile": {"engine": "sim"}}],
        }
    ],
}
_LAYOUT = {
    "slug": "prov",
    "activeDomainSlug": "east",
    "policy": {"provisionRetryBackoffMs": 1000, "provisionTimeoutMs": 600_000},
    "domains": [
        {
            "slug": "east",
            "provider": "static",
            "supervisorUrl": "http://127.0.0.1:9",
            "servingBaseUrl": "http://127.0.0.1:9",
            "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "qwen-small"}]}],
        },
        {
            "slug": "west",
            "provider": "skypilot",
            "placement": {
                "cloud": "aws",
                "region": "us-east-1",
                "fallbackRegions": ["us-west-2"],
                "accelerator": "H100",
            },
            "driver": {"supervisorConfig": SUPERVISOR_CONFIG, "servingPort": 18001},
            "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "qwen-small"}]}],
        },
    ],
}


def managed_layout() -> dict:
    """Return a fresh copy of the layout."""
    return copy.deepcopy(_LAYOUT)


def seed_managed_fleet():
    """Apply the layout; return the Fleet."""
    layout_apply(layout=parse_layout(managed_layout()))
    return Fleet.objects.get(slug="prov")
