"""The fleet page's adapters panel: routes, versions with their copies, the rollout's arms and
freshness, from the same reads as the API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleets.base import clock
from fleets.core import latency_histogram as hist
from fleets.core.adapter_route import AdapterRoute
from fleets.dashboard.adapters import age_label
from fleets.models import AdapterCopy, AdapterVersion, ArmSample, Domain, Fleet, Rollout
from fleets.services.adapter_routes import adapter_route_set
from fleets.services.rollouts import rollout_create, rollout_move

pytestmark = pytest.mark.django_db

NAME = "support-bot"


def _version(fleet, number: int, copy_state: str = "probed") -> None:
    now = clock.now()
    row = AdapterVersion.objects.create(
        fleet=fleet,
        name=NAME,
        version=number,
        base_model="qwen-small",
        digest=f"sha256:{number:064x}",
        size_bytes=2048,
        manifest={},
        completed_at=now - timedelta(hours=26 - number),
        registered_at=now,
    )
    for domain in Domain.objects.filter(fleet=fleet):
        AdapterCopy.objects.create(adapter=row, domain=domain, state=copy_state, updated_at=now)


def _route(fleet, route: AdapterRoute) -> None:
    revision = Fleet.objects.get(pk=fleet.id).route_revision
    assert adapter_route_set(
        fleet_id=fleet.id, name=NAME, route=route, expected_revision=revision, actor="test"
    )


def test_the_panel_shows_route_versions_copies_freshness_and_the_rollouts_arms(
    seeded_fleet, admin_client, fake_clock
):
    _version(seeded_fleet, 1)
    _version(seeded_fleet, 2, copy_state="probed")
    _route(seeded_fleet, AdapterRoute(base="qwen-small", version=1))
    rollout = rollout_create(
        fleet=seeded_fleet,
        body={"candidate": {"kind": "adapter", "adapter": NAME, "version": 2}},
        actor="test",
    )
    # Stepping at 5 %: the route names the candidate, the proxies recorded both arms.
    _route(
        seeded_fleet,
        AdapterRoute(
            base="qwen-small",
            version=1,
            candidate=2,
            weight_permille=50,
            rollout_id=str(rollout.id),
        ),
    )
    for state in ("preparing", "checking", "stepping"):
        rollout_move(
            rollout,
            to_state=state,
            actor="test",
            event=state,
            values={"weight_permille": 50, "step_index": 0, "step_started_at": clock.now()},
        )
    for arm, requests in (("stable", 40), ("candidate", 7)):
        ArmSample.objects.create(
            rollout_id=rollout.id,
            model=NAME,
            arm=arm,
            window_start=clock.now() + timedelta(seconds=1),
            requests=requests,
            ttft=hist.sparse(hist.counts_of([120.0] * requests)),
        )
    fake_clock.advance(seconds=5)
    page = admin_client.get(f"/fleets/{seeded_fleet.slug}/").content.decode()
    assert f'data-adapter="{NAME}"' in page
    assert 'data-adapter-version="1"' in page and 'data-adapter-candidate="2"' in page
    assert "at 5.0 %" in page
    assert 'data-copy="east:probed"' in page and 'data-copy="west:probed"' in page
    # v1 completed 25 h ago and is what users get.
    assert (
        "served version&#x27;s age 25 h 0 min" in page or "served version's age 25 h 0 min" in page
    )
    assert f'data-adapter-rollout="{rollout.id}"' in page
    stable = page.split('data-adapter-arm="stable"')[1].split("</tr>")[0]
    candidate = page.split('data-adapter-arm="candidate"')[1].split("</tr>")[0]
    assert ">40<" in stable and ">7<" in candidate
    # The rollout panel names the versions, both on the active.
    assert f"{NAME}@v1" in page and f"{NAME}@v2" in page
    # Its confirmations describe route writes, never a swap of a domain.
    abort = page.split("Abort the rollout of")[1].split('"')[0]
    assert f"{NAME}@v2" in abort and f"back to {NAME}@v1" in abort and "swapped" not in abort
    assert "one route write makes it answer every request" in page
    assert Rollout.objects.get().state == "stepping"


def test_a_fleet_without_adapters_has_no_panel(seeded_fleet, admin_client):
    page = admin_client.get(f"/fleets/{seeded_fleet.slug}/").content.decode()
    assert "data-adapters" not in page


def test_ages_read_as_people_say_them():
    assert [age_label(s) for s in (None, 45, 600, 3 * 3600 + 1200, 3 * 86400 + 7200)] == [
        "–",
        "45 s",
        "10 min",
        "3 h 20 min",
        "3 d 2 h",
    ]
