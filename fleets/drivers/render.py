"""Render a driver-backed domain as a SkyPilot task YAML or a SkyServe service YAML.

Pure: a validated `CloudPlacement` and `DriverSettings` in, a dict (and its YAML text) out. The
supervisor is the run command; its token and its TLS certificate and key are SkyPilot secrets
whose values are never rendered: the YAML holds each name with a null value (a managed secret
reference, SkyPilot >= 0.14) and the launch passes `--secret NAME`, which SkyPilot fills from
the `sky` process's environment. Field names follow SkyPilot's YAML spec (docs/drivers.md
lists what was relied on).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from fleets.drivers.base import TLS_CERT_ENV, TLS_KEY_ENV
from fleets.drivers.cloud_placement import (
    TOKEN_ENV,
    Candidate,
    CloudPlacement,
    DriverSettings,
    parse_cloud_placement,
    parse_driver_settings,
)

# SkyServe kills a replica whose readiness probe has not passed by then; model servers that load
# weights from a cold disk take minutes.
READINESS_INITIAL_DELAY_S = 1200
READINESS_TIMEOUT_S = 15
# GCP cluster names are at most 35 characters on the cloud side; SkyPilot truncates longer ones
# with a hash, which would make our names ambiguous to read in `sky status`.
MAX_CLUSTER_NAME = 35
# Passed at launch, never rendered: the token and the host's TLS identity.
SECRET_NAMES = (TOKEN_ENV, TLS_CERT_ENV, TLS_KEY_ENV)


@dataclass(frozen=True)
class Rendered:
    """What a launch needs: the YAML document, its text, and the names of secrets to pass."""

    document: dict[str, Any]
    secret_names: tuple[str, ...]

    @property
    def text(self) -> str:
        return yaml.dump(
            self.document,
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=False,
            width=100,
        )


class _Dumper(yaml.SafeDumper):
    """Safe YAML, with multi-line strings (setup, run) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def cluster_name(fleet_slug: str, domain_slug: str) -> str:
    """Return the SkyPilot cluster (or service) name of a domain: stable, readable, bounded."""
    name = f"haru-{fleet_slug}-{domain_slug}"
    if len(name) <= MAX_CLUSTER_NAME:
        return name
    # Keep it unique when truncated: a short digest of the full name stays at the end.
    digest = hashlib.blake2b(name.encode(), digest_size=3).hexdigest()
    return f"{name[: MAX_CLUSTER_NAME - 7].rstrip('-')}-{digest}"


def _infra(placement: CloudPlacement, candidate: Candidate) -> str:
    parts = [placement.cloud, candidate.region]
    if candidate.zone:
        parts.append(candidate.zone)
    return "/".join(parts)


def _resources(placement: CloudPlacement, candidate: Candidate, ports: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "infra": _infra(placement, candidate),
        "accelerators": f"{placement.accelerator}:{placement.accelerator_count}",
        "use_spot": placement.use_spot,
    }
    if placement.disk_size_gb is not None:
        out["disk_size"] = placement.disk_size_gb
    if placement.image is not None:
        out["image_id"] = placement.image
    out["ports"] = ports
    return out


def _envs(settings: DriverSettings) -> dict[str, str]:
    envs = {
        # Outside the cluster Haru must reach the supervisor; the token (a secret) guards it and
        # the supervisor refuses a non-loopback bind without one.
        "HARU_SUPERVISOR_HOST": "0.0.0.0",
        "PORT": str(settings.supervisor_port),
        # Inline JSON: the supervisor reads it from the variable, so no file is written for it.
        "HARU_SUPERVISOR_CONFIG": json.dumps(settings.supervisor_config, separators=(",", ":")),
    }
    envs.update(dict(settings.envs))
    return envs


def _run(settings: DriverSettings) -> str:
    # exec: the supervisor replaces the shell, so SkyPilot's job is the supervisor itself and a
    # supervisor crash ends the job (seen by `sky status`, not hidden behind a live shell).
    return f"exec {settings.supervisor_command}\n"


def _ports(settings: DriverSettings) -> list[int]:
    ports = [settings.supervisor_port]
    if settings.serving_port is not None:
        ports.append(settings.serving_port)
    return ports


def render_task(
    *,
    name: str,
    placement: CloudPlacement,
    settings: DriverSettings,
    candidate: Candidate | None = None,
) -> Rendered:
    """Render the SkyPilot task that runs the domain's supervisor on one launch candidate."""
    where = candidate or placement.candidates()[0]
    doc: dict[str, Any] = {
        "name": name,
        "resources": _resources(placement, where, _ports(settings)),
        "envs": _envs(settings),
        # Null: references filled at launch by `--secret NAME` from the `sky` process's
        # environment; the values never appear in this document. The TLS identity is made per
        # launch and pinned by the control plane (fleets/reconciler/provision.py): with it the
        # supervisor serves HTTPS on its public port.
        "secrets": {name: None for name in SECRET_NAMES},
    }
    if settings.setup.strip():
        doc["setup"] = settings.setup if settings.setup.endswith("\n") else settings.setup + "\n"
    doc["run"] = _run(settings)
    return Rendered(doc, SECRET_NAMES)


def render_service(
    *,
    name: str,
    placement: CloudPlacement,
    settings: DriverSettings,
    candidate: Candidate | None = None,
) -> Rendered:
    """Render the SkyServe service: the task above plus readiness, replicas and the serving
    port the load balancer forwards to."""
    task = render_task(name=name, placement=placement, settings=settings, candidate=candidate)
    if settings.serving_port is None:  # parse_driver_settings refuses this for skyserve
        raise ValueError("a SkyServe service needs a serving port")
    doc = {
        "service": {
            "readiness_probe": {
                "path": settings.readiness_path,
                "initial_delay_seconds": READINESS_INITIAL_DELAY_S,
                "timeout_seconds": READINESS_TIMEOUT_S,
            },
            "replicas": settings.replicas,
            "ports": settings.serving_port,
        },
        **task.document,
    }
    return Rendered(doc, task.secret_names)


def for_review(rendered: Rendered) -> str:
    """Return the YAML for a person to read: each secret shown as the reference it is."""
    text = rendered.text
    for name in rendered.secret_names:
        text = re.sub(
            rf"^(\s+{re.escape(name)}): null$",
            rf"\1: null  # secret: passed at launch as --secret {name}, never written here",
            text,
            flags=re.M,
        )
    return text


def render_for(
    *,
    provider: str,
    name: str,
    placement: CloudPlacement,
    settings: DriverSettings,
    candidate: Candidate | None = None,
) -> Rendered:
    """Render the document the provider launches: a service for skyserve, else a task."""
    render = render_service if provider == "skyserve" else render_task
    return render(name=name, placement=placement, settings=settings, candidate=candidate)


def render_domain(
    *,
    provider: str,
    fleet_slug: str,
    domain_slug: str,
    placement: dict[str, Any],
    driver: dict[str, Any],
    candidate_index: int = 0,
) -> Rendered:
    """Validate a domain's stored placement and driver settings and render what it launches;
    raise CloudPlacementError naming the field."""
    cloud = parse_cloud_placement(placement)
    settings = parse_driver_settings(driver, provider=provider)
    candidates = cloud.candidates()
    return render_for(
        provider=provider,
        name=cluster_name(fleet_slug, domain_slug),
        placement=cloud,
        settings=settings,
        candidate=candidates[candidate_index % len(candidates)],
    )
