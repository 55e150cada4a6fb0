"""The fleet layouts a local Haru serves: over simulated hosts, over the example's two hosts on
ports of the caller's, or one domain in front of a single upstream."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import REPO

if TYPE_CHECKING:
    from .supervisors import SimHost

# Short timings so a whole scenario takes seconds; still far above the sim latencies.
FAST_POLICY = {
    "autoFailover": True,
    "heartbeatStaleMs": 1500,
    "degradedGraceMs": 3000,
    "trainingStopGraceMs": 600,
    "stopTrainingTimeoutMs": 4000,
    "verifyGpuTimeoutMs": 1500,
    "wakeTimeoutMs": 2500,
    "probeTimeoutMs": 2500,
    "switchActiveTimeoutMs": 2000,
    "sleepTimeoutMs": 2500,
    "startTrainingTimeoutMs": 2500,
}
TWO_DOMAIN_EXAMPLE = REPO / "examples" / "fleet.two-domain.json"


def fleet_layout(
    east: SimHost,
    west: SimHost,
    policy: dict | None = None,
    slug: str = "e2e",
    *,
    engine: str | None = None,
) -> dict:
    """Return a fleet over two simulated hosts, east active, with the fast policy; `engine`
    names the bindings' profile engine (the proxy continues a cut stream only on an engine
    that can: fleets/core/continuation.py)."""
    return {
        "slug": slug,
        "activeDomainSlug": "east",
        "policy": {**FAST_POLICY, **(policy or {})},
        "domains": [east.layout_domain(10, engine), west.layout_domain(20, engine)],
    }


def example_supervisor_config(host: str, workdir: Path, model_ports: dict[str, int]) -> dict:
    """Return `examples/supervisor-<host>.json` with its models on `model_ports` and its state
    in `workdir`."""
    config = json.loads((REPO / "examples" / f"supervisor-{host}.json").read_text())
    config["gpu"]["simStateFile"] = str(workdir / host / "sim-gpu.json")
    for slot in config["slots"]:
        if slot["kind"] == "inference":
            for model in slot["models"]:
                model["port"] = model_ports[model["name"]]
        else:
            # The interpreter that runs this has the repo importable; `python3` may not.
            slot["command"] = [sys.executable, *slot["command"][1:]]
            slot["checkpointDir"] = str(workdir / host / "checkpoints")
    return config


def two_domain_layout(supervisor_ports: dict[str, int], configs: dict[str, dict]) -> dict:
    """Return the two-domain example pointed at these supervisors, with each model's engine
    profile copied from its supervisor's config (so the profile-drift flag has something to
    compare). Operator-driven: nothing fails over on its own."""
    data = json.loads(TWO_DOMAIN_EXAMPLE.read_text())
    data["policy"]["autoFailover"] = False
    for domain in data["domains"]:
        host = domain["slug"]
        domain["supervisorUrl"] = f"http://127.0.0.1:{supervisor_ports[host]}"
        ports = {}
        profiles = {}
        for slot in configs[host]["slots"]:
            for model in slot.get("models", []):
                ports[model["name"]] = model["port"]
                profiles[model["name"]] = model["profile"]
        for slot in domain["slots"]:
            for model in slot.get("models", []):
                model["servingUrl"] = f"http://127.0.0.1:{ports[model['name']]}"
                model["profile"] = profiles[model["name"]]
        domain["servingBaseUrl"] = f"http://127.0.0.1:{ports['qwen-small']}"
    return data


def single_upstream_layout(slug: str, model: str, upstream_port: int) -> dict:
    """Return a fleet of one static domain serving `model` from one upstream (no supervisor)."""
    serving = f"http://127.0.0.1:{upstream_port}"
    return {
        "slug": slug,
        "activeDomainSlug": "main",
        "domains": [
            {
                "slug": "main",
                "provider": "static",
                "servingBaseUrl": serving,
                "slots": [
                    {
                        "kind": "inference",
                        "gpuIndex": 0,
                        "models": [{"name": model, "servingUrl": serving}],
                    }
                ],
            }
        ],
    }
