"""Failover keeps adapters: the promotion's probe proves every routed adapter version on its
target after the wake, and refuses to move routing to a target that lacks one; readiness calls
such a standby at risk, naming the version."""

from __future__ import annotations

import pytest

from common.adapter_manifest import manifest_parse, store_id
from fleets.core.adapter_route import adapter_routes_parse
from fleets.core.adapters import CopyState
from fleets.core.readiness import ReadinessCheck, ReadinessVerdict
from fleets.models import AdapterCopy, Domain, Fleet
from fleets.reads.readiness import fleet_readiness
from fleets.reconciler import adapters as adapter_pass
from fleets.reconciler.golden import routed_adapters_check
from fleets.reconciler.supervisor.client import client_for
from fleets.services.operations import operation_request
from tests.reconciler.fake_adapters import FEATURE_ADAPTERS, FakeAdapterStore, make_adapter
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db


@pytest.fixture
def routed(fleet, hosts, tick):
    """Both hosts serve adapters; `bot` v1, trained on the standby, is routed on the active."""
    stores = {}
    for slug, host in hosts.hosts.items():
        host.features = (*host.features, FEATURE_ADAPTERS)
        host.golden = True
        stores[slug] = host.adapter_store = FakeAdapterStore()
    adapter_pass.forget()
    manifest, files = make_adapter("bot")
    stores["west"].train(manifest, files)
    tick()  # heartbeats learn the features; the pass registers, relays, probes, routes
    tick()
    fleet.refresh_from_db()
    assert adapter_routes_parse(fleet.adapter_routes)["bot"].version == 1
    yield stores, store_id(manifest_parse(manifest).digest)
    adapter_pass.forget()


def _west_copy():
    return AdapterCopy.objects.get(adapter__name="bot", domain__slug="west")


def test_a_promotion_proves_the_routed_adapter_on_its_target_and_keeps_the_route(
    fleet, routed, tick, domains, fake_clock
):
    west = domains()["west"]
    operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op.state == "succeeded", op.error
    fleet.refresh_from_db()
    assert fleet.active_domain_id == west.id
    assert adapter_routes_parse(fleet.adapter_routes)["bot"].version == 1
    copy = _west_copy()
    assert copy.state == CopyState.PROBED
    assert copy.baseline == {"Say hi": "Ahoy matey"}


def test_a_promotion_to_a_standby_lacking_a_routed_version_fails_and_routing_stays(
    fleet, routed, tick, domains, fake_clock
):
    stores, sid = routed
    # West lost its copy and cannot receive one (every PUT is cut).
    del stores["west"].stored[sid]
    stores["west"].loads.clear()
    stores["west"].cut_after_puts = 0
    west = domains()["west"]
    operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)
    assert op.state == "failed"
    assert op.error["code"] == "probe_failed"
    assert "bot@v1" in op.error["message"]
    fleet.refresh_from_db()
    assert fleet.active_domain_id == domains()["east"].id


def test_the_adapter_probe_fails_on_a_target_serving_base_answers(fleet, routed, hosts):
    stores, _ = routed
    west = Domain.objects.get(fleet=fleet, slug="west")
    for model in hosts.hosts["west"].models:
        hosts.hosts["west"].models[model] = False  # awake: the remembered load applies
    stores["west"].serves_base.add("bot@v1")
    problems = routed_adapters_check(
        fleet_id=fleet.id, domain=west, client=client_for(west), timeout=5, actor="test"
    )
    assert len(problems) == 1 and "loaded but serving nothing" in problems[0]
    assert _west_copy().state == CopyState.STORED  # nothing proven, nothing moved

    stores["west"].serves_base.clear()
    assert (
        routed_adapters_check(
            fleet_id=fleet.id, domain=west, client=client_for(west), timeout=5, actor="test"
        )
        == []
    )
    assert _west_copy().state == CopyState.PROBED


def test_readiness_calls_a_standby_without_a_routed_version_at_risk(fleet, routed, tick):
    def adapters_reason():
        readiness = fleet_readiness(Fleet.objects.get(pk=fleet.pk))
        found = [r for r in readiness.reasons if r.check == ReadinessCheck.ADAPTERS]
        return readiness, found[0]

    readiness, reason = adapters_reason()
    assert reason.ok is True

    AdapterCopy.objects.filter(pk=_west_copy().pk).update(state=CopyState.ABSENT.value)
    readiness, reason = adapters_reason()
    assert reason.ok is False
    assert "bot@v1" in reason.message
    assert readiness.verdict != ReadinessVerdict.READY


def test_readiness_of_a_fleet_without_adapter_routes_lists_no_adapter_check(fleet):
    readiness = fleet_readiness(fleet)
    assert ReadinessCheck.ADAPTERS not in {r.check for r in readiness.reasons}


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet path", "full path"])
def test_a_completed_adapter_is_registered_whichever_path_the_tick_takes(
    fleet, routed, tick, hosts, monkeypatch, fake_clock, quiet
):
    """The standby's heartbeat carries `lastAdapterAt`; a tick that sees it move lists the
    store and registers the new version, on the quiet path and on the full one (a fleet with a
    recent operation is not quiet for a while: it must not miss what its trainer completed)."""
    from fleets.models import AdapterVersion  # noqa: PLC0415 - beside the fixture's models
    from fleets.reads.tick_snapshot import TickSnapshot  # noqa: PLC0415

    if not quiet:
        monkeypatch.setattr(TickSnapshot, "quiet", lambda self, now: False)
    stores, _sid = routed
    tick()
    tick()  # nothing moved: the pass has looked and rests
    stores["west"].train(*make_adapter("bot", weights=b"second" * 10))
    assert not AdapterVersion.objects.filter(fleet=fleet, name="bot", version=2).exists()
    hosts.hosts["west"].adapter_at = "2026-12-05T09:00:00Z"
    for _ in range(4):  # a healthy standby is asked for its status every 10 s
        fake_clock.advance(seconds=5)
        tick()
    assert AdapterVersion.objects.filter(fleet=fleet, name="bot", version=2).exists()
