"""The tick's baseline pass: the active is probed for golden baselines it has none of, bounded
and rate-limited per fleet, and never while an operation is in flight."""

from __future__ import annotations

import pytest

from fleets.core.golden import GoldenKey, profile_fingerprint, request_fingerprint
from fleets.core.policy import Policy
from fleets.models import Domain, Fleet, GoldenBaseline, ModelBinding
from fleets.reconciler.golden import (
    BASELINE_PROBE_INTERVAL_MS,
    active_baselines_fill,
    missing_baselines,
    targets_of,
)
from fleets.reconciler.supervisor.client import client_for
from fleets.services.baselines import NewBaseline, baseline_record
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


def _fill(fleet, fake_clock):
    fleet.refresh_from_db()
    return active_baselines_fill(
        fleet=fleet,
        policy=Policy.resolve(fleet.policy),
        client_for=client_for,
        now=fake_clock.now(),
    )


def _fresh_turn(fleet) -> None:
    """Give the fleet its turn back (the tick just took it): only the case under test may
    keep the probe from going out."""
    Fleet.objects.filter(pk=fleet.pk).update(baseline_probe_at=None)


def _probes(hosts, slug="east") -> int:
    return hosts.hosts[slug].effects["probed"]


def _record_all(fleet) -> None:
    policy = Policy.resolve(fleet.policy)
    request = request_fingerprint(policy.probe_prompt, policy.probe_max_tokens)
    east = Domain.objects.get(fleet=fleet, slug="east")
    baseline_record(
        fleet_id=fleet.id,
        domain_id=east.id,
        baselines=[
            NewBaseline(
                GoldenKey(b.name, "", profile_fingerprint(b.profile), "v1", request), "answer"
            )
            for b in ModelBinding.objects.filter(domain=east)
        ],
        reason="operator",
        actor="test",
        replace=False,
    )


def test_the_tick_probes_the_active_once_per_interval_while_a_baseline_is_missing(
    fleet, tick, hosts, fake_clock
):
    assert _probes(hosts) == 0
    tick()  # heartbeats show east serving; then the pass probes it
    assert _probes(hosts) == 1
    assert Fleet.objects.get(pk=fleet.pk).baseline_probe_at == fake_clock.now()
    # The scripted supervisor answers no golden probe: nothing recorded, still missing, but the
    # fleet's turn is taken until the interval has passed, by any process.
    assert not GoldenBaseline.objects.exists()
    _fill(fleet, fake_clock)
    fake_clock.advance(ms=BASELINE_PROBE_INTERVAL_MS - 1)
    tick()
    assert _probes(hosts) == 1
    fake_clock.advance(ms=1)
    _fill(fleet, fake_clock)
    assert _probes(hosts) == 2
    # Never the standby.
    assert _probes(hosts, "west") == 0


def test_nothing_is_probed_when_every_baseline_is_recorded(fleet, tick, hosts, fake_clock):
    tick()
    _fresh_turn(fleet)
    _record_all(fleet)
    east = Domain.objects.get(fleet=fleet, slug="east")
    assert missing_baselines(fleet.id, targets_of(east), Policy.resolve(fleet.policy)) == []
    before = _probes(hosts)
    assert _fill(fleet, fake_clock) == []
    assert _probes(hosts) == before
    assert Fleet.objects.get(pk=fleet.pk).baseline_probe_at is None


def test_a_non_deterministic_model_is_never_missing(fleet, tick, hosts, fake_clock):
    tick()
    _fresh_turn(fleet)
    ModelBinding.objects.filter(domain__fleet=fleet).update(golden={"deterministic": False})
    before = _probes(hosts)
    _fill(fleet, fake_clock)
    assert _probes(hosts) == before


def test_nothing_is_probed_while_an_operation_is_in_flight(fleet, tick, hosts, fake_clock):
    tick()
    _fresh_turn(fleet)
    Domain.objects.filter(fleet=fleet).update(last_seen_at=fake_clock.now())
    operation_request(fleet=fleet, kind="drill", target_domain_id=None, actor="test")
    before = _probes(hosts)
    _fill(fleet, fake_clock)
    assert _probes(hosts) == before
    assert Fleet.objects.get(pk=fleet.pk).baseline_probe_at is None


def test_an_active_whose_models_do_not_all_serve_is_not_probed(fleet, tick, hosts, fake_clock):
    tick()
    _fresh_turn(fleet)
    east = Domain.objects.get(fleet=fleet, slug="east")
    east.slots.filter(kind="inference").update(state="sleeping")
    before = _probes(hosts)
    _fill(fleet, fake_clock)
    assert _probes(hosts) == before
