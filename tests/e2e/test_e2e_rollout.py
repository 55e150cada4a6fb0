"""A rollout against two real simulated hosts: the supervisors' swap, the answer checks against
the stable arm, the planned promotion and the old active moved to the new version."""

from __future__ import annotations

import httpx
import pytest

from fleets.models import Fleet, ModelBinding, Rollout
from fleets.services.rollouts import rollout_create
from tests.e2e.harness import TOKEN

pytestmark = pytest.mark.django_db(transaction=True)

FINAL = ("succeeded", "rolled_back", "aborted", "failed")


def _swap_of(host, model: str) -> dict:
    status = httpx.get(
        f"{host.url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    ).json()
    entry = next(m for s in status["slots"] for m in s.get("models", ()) if m["name"] == model)
    return {"port": entry["port"], **entry.get("swap", {})}


def test_a_same_weights_rollout_ends_with_both_hosts_on_the_new_profile(
    make_hosts, make_fleet, drive
):
    east, west = make_hosts()
    fleet = make_fleet(east, west)
    drive(fleet, lambda: Fleet.objects.get(pk=fleet.id).domains.filter(state="ready").count() == 2)
    model = "qwen-small"

    def profile_of(host) -> dict:
        models = host.config["slots"][0]["models"]
        return next(m["profile"] for m in models if m["name"] == model)

    args = [a for a in profile_of(east)["extraArgs"] if a != "--start-asleep"]
    new = {"engine": "sim", "extraArgs": [*args, "--ttft-ms", "5"]}
    # The layout's bindings name the profile each host runs, as a layout written for them does.
    for host in (east, west):
        ModelBinding.objects.filter(domain__fleet=fleet, domain__slug=host.name).update(
            profile=profile_of(host)
        )
    rollout = rollout_create(
        fleet=fleet,
        body={
            "model": model,
            "candidate": {"kind": "same-weights", "profile": new},
            "swapMode": "in-place",
            "steps": [{"weight": 100}],
        },
        actor="e2e",
    )

    done = drive(
        fleet,
        lambda: (r := Rollout.objects.get(pk=rollout.id)).state in FINAL and r,
        timeout=120,
    )

    assert done.state == "succeeded", done.why
    fleet.refresh_from_db()
    assert fleet.active_domain.slug == "west"
    for host in (east, west):
        swap = _swap_of(host, model)
        assert swap["state"] == "switched" and swap["mode"] == "in-place"
        binding = ModelBinding.objects.get(domain__fleet=fleet, domain__slug=host.name, name=model)
        assert binding.profile == new
        assert binding.serving_url.endswith(f":{swap['port']}")
