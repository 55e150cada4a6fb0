"""Fleets over the fleet farm (haru/local/farm_fleets.py): N two-domain fleets through the real
layout service, each domain pointed at its farm host and given its own derived token."""

from __future__ import annotations

import pytest

from common.farm_manifest import plan_hosts
from fleets.core.credentials import derive_supervisor_token
from fleets.models import Domain, Fleet, ModelBinding
from haru.local.farm_fleets import fleet_slug, plan_farm, seed_farm_fleets

MASTER = "farm-fleets-test-master-key-7c1e9b3a5d2f4e6a"

pytestmark = pytest.mark.django_db


@pytest.fixture
def master_key(settings):
    settings.HARU = {
        **settings.HARU,
        "supervisor_token": None,
        "supervisor_master_key": MASTER,
        "supervisor_hosts": (),
    }


def test_n_fleets_are_seeded_over_their_hosts_with_their_own_tokens(master_key):
    plans = plan_farm(3)
    seeded = seed_farm_fleets(plans)
    assert sorted(Fleet.objects.values_list("slug", flat=True)) == [fleet_slug(i) for i in range(3)]
    for i in range(3):
        fleet = Fleet.objects.get(slug=fleet_slug(i))
        east = Domain.objects.get(fleet=fleet, slug="east")
        west = Domain.objects.get(fleet=fleet, slug="west")
        assert fleet.active_domain_id == east.id
        assert fleet.policy["autoFailover"] is True
        assert east.supervisor_url == plans[2 * i].url
        assert west.supervisor_url == plans[2 * i + 1].url
        bindings = ModelBinding.objects.filter(slot__domain=west)
        assert {b.serving_url for b in bindings} == {
            plans[2 * i + 1].serving_url(m.name) for m in plans[2 * i + 1].models
        }
        assert seeded[2 * i].token == derive_supervisor_token(MASTER, east.id)
        assert seeded[2 * i + 1].token == derive_supervisor_token(MASTER, west.id)
    # Everything but the tokens is as planned; the standbys (odd hosts) start asleep.
    assert [(s.name, s.port, s.models, s.asleep) for s in seeded] == [
        (p.name, p.port, p.models, p.asleep) for p in plans
    ]
    assert [p.asleep for p in plans] == [False, True] * 3
    assert len({s.token for s in seeded}) == 6


def test_seeding_without_a_supervisor_credential_is_refused(settings):
    settings.HARU = {**settings.HARU, "supervisor_token": None, "supervisor_master_key": None}
    with pytest.raises(ValueError, match="HARU_SUPERVISOR_MASTER_KEY"):
        seed_farm_fleets(plan_farm(1))
    assert not Fleet.objects.exists()


def test_an_odd_number_of_hosts_is_refused_before_anything_is_written(master_key):
    with pytest.raises(ValueError, match="two hosts per fleet"):
        seed_farm_fleets(plan_hosts(3))
    assert not Fleet.objects.exists()
