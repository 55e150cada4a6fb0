"""Each binding's engine version, as its supervisor reports it, decides which golden baseline is
missing: an engine upgrade on the active is baselined before a standby on that version wakes and
is judged (the vllm#53888 window), and a standby whose version has no baseline is at risk."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleets.models import Event, GoldenBaseline, ModelBinding
from fleets.reads.readiness import fleet_readiness
from fleets.reconciler.golden import BASELINE_PROBE_INTERVAL_MS
from fleets.services.heartbeats import binding_engine_version_record
from fleets.services.operations import operation_request
from tests.reconciler.test_reconciler_flow import run_until_done

pytestmark = pytest.mark.django_db

MODELS = ("llama-small", "qwen-small")


def _versions(fleet, slug: str) -> dict[str, str]:
    return dict(
        ModelBinding.objects.filter(domain__fleet=fleet, domain__slug=slug).values_list(
            "name", "engine_version"
        )
    )


def _golden(hosts, version: str) -> None:
    for host in hosts.hosts.values():
        host.golden = True
        host.engine_version = version


def _baselines(fleet) -> set[tuple[str, str, str]]:
    return set(
        GoldenBaseline.objects.filter(fleet=fleet).values_list(
            "model_name", "engine_version", "reason"
        )
    )


def test_the_heartbeat_keeps_each_bindings_engine_version_with_an_event_per_change(
    fleet, tick, hosts, fake_clock
):
    tick()
    assert set(_versions(fleet, "east").values()) == {""}  # not reported: nothing written
    hosts.hosts["east"].engine_version = "0.11.2"
    tick()
    assert _versions(fleet, "east") == dict.fromkeys(MODELS, "0.11.2")
    assert set(_versions(fleet, "west").values()) == {""}

    def changed():
        return Event.objects.filter(kind="model.engine_version.changed")

    assert changed().count() == 2
    assert {(e.data["model"], e.data["from"], e.data["to"]) for e in changed()} == {
        (m, None, "0.11.2") for m in MODELS
    }
    fake_clock.advance(ms=1000)
    tick()
    assert changed().count() == 2  # unchanged: no write, no event
    hosts.hosts["east"].engine_version = "0.12.0"
    fake_clock.advance(ms=1000)
    tick()
    assert _versions(fleet, "east") == dict.fromkeys(MODELS, "0.12.0")
    assert changed().count() == 4
    # A slower beat that read the old version before the new one was recorded loses.
    binding = ModelBinding.objects.get(domain__slug="east", name="llama-small")
    assert binding.engine_version_at == fake_clock.now()
    older = fake_clock.now() - timedelta(milliseconds=500)
    assert not binding_engine_version_record(
        binding_id=binding.id, engine_version="0.11.2", observed_at=older
    )
    assert ModelBinding.objects.get(pk=binding.pk).engine_version == "0.12.0"


def test_an_engine_upgrade_on_the_active_is_baselined_before_the_standbys_wake_is_judged(
    fleet, tick, hosts, fake_clock
):
    _golden(hosts, "0.11.2")
    tick()  # versions recorded, then the baseline pass probes the active
    assert _baselines(fleet) == {(m, "0.11.2", "active_serving") for m in MODELS}
    # Both hosts are upgraded; the standby's new engine answers wrong after its wake.
    _golden(hosts, "0.12.0")
    hosts.hosts["west"].answers = {"llama-small": "garbled after the upgrade"}
    fake_clock.advance(ms=BASELINE_PROBE_INTERVAL_MS)
    tick()
    # The active was probed for the new version's baselines before anything woke the standby.
    assert _baselines(fleet) == {
        (m, v, "active_serving") for m in MODELS for v in ("0.11.2", "0.12.0")
    }
    assert hosts.hosts["west"].effects["woke"] == 0

    operation_request(fleet=fleet, kind="drill", target_domain_id=None, actor="test")
    op = run_until_done(tick, clock=fake_clock, step_ms=1000)

    assert op.state == "failed" and op.error["code"] == "probe_mismatch", op.error
    assert "llama-small" in op.error["message"] and "garbled" in op.error["message"]
    # The standby's wrong answer did not become its own baseline.
    assert not GoldenBaseline.objects.filter(reason="first_serving").exists()


def test_a_standby_whose_engine_version_has_no_baseline_is_at_risk(fleet, tick, hosts, fake_clock):
    _golden(hosts, "0.11.2")
    tick()
    for _ in range(3):  # the drill's proof is not under test here
        fake_clock.advance(ms=1000)
        tick()
    readiness = fleet_readiness(fleet, now=fake_clock.now())
    baselines = next(r for r in readiness.reasons if r.check == "baselines")
    assert baselines.ok is True
    recorded = GoldenBaseline.objects.filter(fleet=fleet).order_by("recorded_at").first()
    assert recorded is not None and baselines.at == recorded.recorded_at
    # Only the standby was upgraded: the active cannot give the new version's baseline.
    hosts.hosts["west"].engine_version = "0.12.0"
    fake_clock.advance(ms=1000)
    tick()
    readiness = fleet_readiness(fleet, now=fake_clock.now())
    baselines = next(r for r in readiness.reasons if r.check == "baselines")
    assert readiness.verdict == "at_risk" and baselines.ok is False
    assert baselines.message == (
        "no golden baseline yet for llama-small on engine 0.12.0, qwen-small on engine 0.12.0"
    )
    west = fleet.domains.get(slug="west")
    assert baselines.at == west.last_seen_at
    assert baselines.to_json(fake_clock.now())["ageMs"] == 0
