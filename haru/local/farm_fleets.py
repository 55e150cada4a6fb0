"""Fleets over the fleet farm (`python -m supervisor.farm`): N fleets of two domains each,
written through the real layout service, and the farm's manifest with each domain's token.

Fleet i is `farm-0000`.. over hosts 2i (`east`, active, models awake) and 2i+1 (`west`,
standby, models asleep). Each domain's supervisor requires the token the control plane derives
for it from HARU_SUPERVISOR_MASTER_KEY, so the layouts go in first (the domains get their ids),
then the manifest is written with the derived tokens, then the farm starts from it.

    python -m haru.local.farm_fleets --fleets 100 --manifest var/farm.json

(Django settings from the environment, as `manage.py`'s; HARU_SUPERVISOR_MASTER_KEY set.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.farm_manifest import HostPlan, plan_hosts, write_manifest

FLEET_PREFIX = "farm-"
DOMAINS = ("east", "west")


def fleet_slug(i: int) -> str:
    return f"{FLEET_PREFIX}{i:04d}"


def plan_farm(fleets: int) -> list[HostPlan]:
    """Two hosts per fleet, the second of each pair (the standby) with its models asleep."""
    return plan_hosts(2 * fleets, asleep=lambda i: i % 2 == 1)


def farm_layout(i: int, east: HostPlan, west: HostPlan, policy: dict[str, Any]) -> dict:
    """Fleet i's layout over two farm hosts: `east` active, `west` its standby."""

    def domain(slug: str, host: HostPlan, priority: int) -> dict[str, Any]:
        return {
            "slug": slug,
            "provider": "static",
            "priority": priority,
            "supervisorUrl": host.url,
            "servingBaseUrl": host.serving_url(host.models[0].name),
            "slots": [
                {
                    "kind": "inference",
                    "gpuIndex": 0,
                    "sleepLevel": 1,
                    "models": [
                        {"name": m.name, "servingUrl": host.serving_url(m.name)}
                        for m in host.models
                    ],
                }
            ],
        }

    return {
        "slug": fleet_slug(i),
        "activeDomainSlug": "east",
        "policy": dict(policy),
        "domains": [domain("east", east, 10), domain("west", west, 20)],
    }


def seed_farm_fleets(
    plans: Sequence[HostPlan],
    *,
    policy: dict[str, Any] | None = None,
    on_fleet: Callable[[int], None] | None = None,
) -> list[HostPlan]:
    """Apply one layout per pair of hosts; return the plans with each domain's own token.

    Django must be set up, with HARU_SUPERVISOR_MASTER_KEY (or the shared token) configured.
    """
    # Imported here: the farm's own side (plans, manifest) needs no Django.
    from fleets.base.conf import haru_settings  # noqa: PLC0415
    from fleets.base.supervisor_tokens import supervisor_token_for  # noqa: PLC0415
    from fleets.layouts.loader import parse_layout  # noqa: PLC0415
    from fleets.models import Domain  # noqa: PLC0415
    from fleets.services.layouts import layout_apply  # noqa: PLC0415

    if len(plans) % 2:
        raise ValueError(f"two hosts per fleet: {len(plans)} is odd")
    if not (haru_settings().supervisor_master_key or haru_settings().supervisor_token):
        raise ValueError("set HARU_SUPERVISOR_MASTER_KEY: farm hosts require a token")
    policy = {"autoFailover": True, **(policy or {})}
    pairs = [(plans[k], plans[k + 1]) for k in range(0, len(plans), 2)]
    for i, (east, west) in enumerate(pairs):
        layout_apply(layout=parse_layout(farm_layout(i, east, west, policy)), actor="farm")
        if on_fleet is not None:
            on_fleet(i + 1)
    ids = {
        (slug, d): pk
        for slug, d, pk in Domain.objects.filter(fleet__slug__startswith=FLEET_PREFIX).values_list(
            "fleet__slug", "slug", "id"
        )
    }
    out: list[HostPlan] = []
    for i, pair in enumerate(pairs):
        for dslug, host in zip(DOMAINS, pair, strict=True):
            token = supervisor_token_for(ids[(fleet_slug(i), dslug)])
            assert token is not None  # a credential is configured: checked above
            out.append(replace(host, token=token))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m haru.local.farm_fleets", description=__doc__)
    p.add_argument("--fleets", type=int, required=True)
    p.add_argument("--manifest", type=Path, required=True, help="written for the farm")
    a = p.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")
    import django  # noqa: PLC0415

    django.setup()
    started = time.monotonic()
    plans = seed_farm_fleets(plan_farm(a.fleets))
    write_manifest(a.manifest, plans)
    print(f"{a.fleets} fleets seeded in {time.monotonic() - started:.1f}s; manifest {a.manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
