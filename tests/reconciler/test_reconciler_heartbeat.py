"""Heartbeats mirror slot health and domain state; escalation re-checks everything in its UPDATE."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from fleets.models import Domain, Event, ModelBinding, Operation, Slot
from fleets.reconciler.tick import tick_run
from fleets.services.escalation import domain_escalate
from fleets.services.heartbeats import slot_mirror
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


def state(domain_slug: str, kind: str | None = None) -> str:
    if kind is None:
        return Domain.objects.get(slug=domain_slug).state
    return Slot.objects.get(domain__slug=domain_slug, kind=kind).state


def test_healthy_fleet_is_mirrored_as_seeded_and_marked_seen(fleet, tick, fake_clock):
    tick()
    assert state("east") == "ready" and state("west") == "ready"
    assert state("east", "inference") == "serving"
    assert state("west", "inference") == "sleeping"
    assert state("west", "training") == "training"
    assert Slot.objects.get(domain__slug="west", kind="training").pids
    east = Domain.objects.get(slug="east")
    assert east.last_seen_at == fake_clock.now()
    assert east.last_report["heartbeat"]["ok"] is True
    assert east.last_report["slots"][0]["kind"] == "inference"


def test_an_active_with_a_sleeping_model_is_degraded_then_recovers(fleet, tick, hosts):
    tick()
    hosts.hosts["east"].models["qwen-small"] = True
    tick()
    assert state("east", "inference") == "failed"
    assert state("east") == "degraded"
    hosts.hosts["east"].models["qwen-small"] = False
    tick()
    assert state("east", "inference") == "serving"
    assert state("east") == "ready"


def test_an_awake_standby_is_not_in_standby_posture(fleet, tick, hosts, standby_due):
    # Only the mirror here: the reconciler's own restore would put the models back to sleep.
    fleet.policy = {**fleet.policy, "restoreStandbyOnReturn": False}
    fleet.save(update_fields=["policy"])
    tick()
    hosts.hosts["west"].models["llama-small"] = False
    standby_due()
    tick()
    assert state("west", "inference") == "failed"
    hosts.hosts["west"].models["llama-small"] = True
    tick()
    assert state("west", "inference") == "sleeping"


def test_an_unreachable_domain_is_degraded_and_reported_once(
    fleet, tick, hosts, fake_clock, standby_due
):
    tick()
    seen = Domain.objects.get(slug="west").last_seen_at
    hosts.hosts["west"].down = True
    standby_due()  # a healthy standby is asked at its own pace; once failing, every tick
    for _ in range(3):
        fake_clock.advance(ms=100)
        tick()
    west = Domain.objects.get(slug="west")
    assert west.state == "degraded"
    assert west.last_seen_at == seen  # only a good heartbeat moves it
    assert state("west", "inference") == "failed"
    # Training is left alone while nobody can see it.
    assert state("west", "training") == "training"
    assert Event.objects.filter(kind="domain.heartbeat.failed", domain=west).count() == 1
    assert west.last_report["heartbeat"]["error"]["kind"] == "network"

    hosts.hosts["west"].down = False
    tick()
    assert state("west") == "ready"
    assert Event.objects.filter(kind="domain.heartbeat.recovered", domain=west).count() == 1


def test_a_pid_less_running_trainer_never_counts(fleet, tick, hosts):
    west = hosts.hosts["west"]
    west.pid = None  # "running", but no PID to prove it
    tick()
    assert state("west", "training") == "idle"


def test_a_report_older_than_the_slot_change_does_not_overwrite_it(fleet, fake_clock):
    slot = Slot.objects.get(domain__slug="west", kind="inference")
    observed = fake_clock.now() - timedelta(seconds=1)  # read before the slot last moved
    moved = slot_mirror(
        slot_id=slot.id,
        from_state="sleeping",
        to_state="failed",
        observed_at=observed,
        now=fake_clock.now(),
    )
    assert moved is False
    assert state("west", "inference") == "sleeping"


def test_degraded_active_escalates_after_grace_and_fails_over(fleet, tick, hosts, fake_clock):
    tick()
    hosts.hosts["east"].models["qwen-small"] = True  # reachable, but not serving everything
    tick()
    assert state("east") == "degraded"
    fake_clock.advance(ms=4000)
    tick()
    assert state("east") == "degraded"  # within degradedGraceMs (5000)
    fake_clock.advance(ms=1500)
    tick()
    assert Event.objects.filter(kind="domain.degraded.escalated").count() == 1
    op = Operation.objects.get()
    assert op.reason == "auto_failover" and op.kind == "promote"
    assert op.target_domain.slug == "west"


def test_a_degraded_active_escalates_under_the_lease_its_standby_fresh_by_sightings_alone(
    fleet, hosts, fake_clock
):
    # Under the tick lease the standby's unchanged beats write no row: past the stale window
    # (3 s) its row reads stale, and only the lease's sightings say it is fresh. The escalation
    # (its UPDATE re-checks a viable standby) must still happen after the grace.
    def ticked():
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran

    ticked()
    hosts.hosts["east"].models["qwen-small"] = True  # reachable, but not serving everything
    ticked()
    assert state("east") == "degraded"
    west_row = Domain.objects.get(slug="west").last_seen_at
    for _ in range(11):  # 5.5 s in ticks of 0.5 s, past the 5 s grace
        fake_clock.advance(ms=500)
        ticked()
        if Operation.objects.exists():
            break
    assert Domain.objects.get(slug="west").last_seen_at == west_row  # never written
    assert Event.objects.filter(kind="domain.degraded.escalated").count() == 1
    op = Operation.objects.get()
    assert op.reason == "auto_failover" and op.target_domain.slug == "west"


def test_a_standby_fresh_by_sightings_no_longer_counts_once_its_heartbeat_fails(
    fleet, tick, fake_clock
):
    tick()
    _degrade_east_long_ago(fake_clock)
    fake_clock.advance(ms=3001)  # the standby's row is stale
    west = Domain.objects.get(slug="west")
    Domain.objects.filter(pk=west.pk).update(heartbeat_failing_since=fake_clock.now())
    assert escalate(fake_clock, seen_fresh=[west.id]) is False
    Domain.objects.filter(pk=west.pk).update(heartbeat_failing_since=None)
    assert escalate(fake_clock, seen_fresh=[west.id]) is True


def _degrade_east_long_ago(fake_clock):
    Domain.objects.filter(slug="east").update(
        state="degraded", state_updated_at=fake_clock.now() - timedelta(seconds=60)
    )
    # Its data path fails too (a model server down): otherwise it is never escalated
    # (tests/reconciler/test_reconciler_partition.py), and these tests test the other guards.
    ModelBinding.objects.filter(domain__slug="east", name="qwen-small").update(health="down")


def escalate(fake_clock, **kwargs) -> bool:
    return domain_escalate(
        domain_id=Domain.objects.get(slug="east").id,
        now=fake_clock.now(),
        degraded_grace_ms=kwargs.get("grace", 5000),
        heartbeat_stale_ms=3000,
        seen_fresh=kwargs.get("seen_fresh", ()),
    )


def test_escalation_refuses_with_a_promotion_in_flight(fleet, tick, fake_clock):
    tick()
    operation_request(
        fleet=fleet, kind="promote", target_domain_id=Domain.objects.get(slug="west").id
    )
    _degrade_east_long_ago(fake_clock)
    assert escalate(fake_clock) is False
    assert state("east") == "degraded"


def test_a_demote_in_flight_does_not_hold_back_the_escalation(fleet, tick, fake_clock):
    # Finding 13: the demote is pre-empted by the failover that follows, not the other way.
    tick()
    operation_request(
        fleet=fleet, kind="demote", target_domain_id=Domain.objects.get(slug="west").id
    )
    _degrade_east_long_ago(fake_clock)
    assert escalate(fake_clock) is True
    assert state("east") == "failed"


def test_escalation_refuses_without_a_viable_standby(fleet, tick, hosts, fake_clock):
    tick()
    Slot.objects.filter(domain__slug="west", kind="inference").update(state="failed")
    _degrade_east_long_ago(fake_clock)
    assert escalate(fake_clock) is False


def test_escalation_refuses_a_stale_standby(fleet, tick, fake_clock):
    tick()
    _degrade_east_long_ago(fake_clock)
    fake_clock.advance(ms=3001)
    assert escalate(fake_clock) is False


def test_escalation_refuses_with_auto_failover_off(fleet, tick, fake_clock):
    tick()
    fleet.policy = {**fleet.policy, "autoFailover": False}
    fleet.save(update_fields=["policy"])
    _degrade_east_long_ago(fake_clock)
    assert escalate(fake_clock) is False


def test_escalation_refuses_within_grace_and_never_a_standby(fleet, tick, fake_clock):
    tick()
    _degrade_east_long_ago(fake_clock)
    assert escalate(fake_clock, grace=120_000) is False
    Domain.objects.filter(slug="west").update(
        state="degraded", state_updated_at=fake_clock.now() - timedelta(seconds=60)
    )
    assert (
        domain_escalate(
            domain_id=Domain.objects.get(slug="west").id,
            now=fake_clock.now(),
            degraded_grace_ms=5000,
            heartbeat_stale_ms=3000,
        )
        is False
    )
    Domain.objects.filter(slug="west").update(state="ready")  # a viable standby again
    assert escalate(fake_clock) is True
    assert state("east") == "failed"


def test_importing_the_reconciler_starts_no_threads():
    # The heartbeat pools are made on first use: the API and management commands import the
    # reconciler without ever ticking, and must not carry 32 idle threads for it.
    code = (
        "import django, threading; django.setup(); "
        "import fleets.reconciler.tick, fleets.api.views; "
        "print(sorted(t.name for t in threading.enumerate()))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "haru.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "['MainThread']"
