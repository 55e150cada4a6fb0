"""Heartbeats also read GPU memory: beside the status, never waited for, never deciding state.

What the reconciler stores is what the dashboard draws (`last_report["gpus"]`, `gpusAt`), and
the status goes in normalized (`fleets.core.report`), so the fields the dashboard shows (a
trainer's `lastCheckpointAt`) reach it as the supervisor reported them.
"""

from __future__ import annotations

import threading
import time

import pytest

from fleets.core.heartbeat_cadence import standby_every
from fleets.dashboard.selectors import fleet_page
from fleets.metrics import reconcile as fleet_metrics
from fleets.models import Domain, Event
from fleets.reads.selectors import fleet_view
from fleets.reconciler import heartbeat
from fleets.reconciler.heartbeat import pending_gpu_read
from tests.reconciler.fakes import CONTEXT_MIB, TOTAL_MIB, TRAINER_MIB, WEIGHTS_MIB

pytestmark = pytest.mark.django_db


def report(slug: str) -> dict:
    return Domain.objects.get(slug=slug).last_report


def wait_for_reads(domains) -> None:
    """Wait until every GPU memory read in flight has its answer (they run on their own pool)."""
    for d in domains().values():
        read = pending_gpu_read(d.id)
        if read is not None:
            read.future.result(timeout=10)


@pytest.fixture
def settle(tick, domains, fake_clock):
    """Tick, let the GPU reads answer, tick again: the second beat stores any late answer."""

    def run():
        tick()
        wait_for_reads(domains)
        fake_clock.advance(ms=100)
        tick()

    return run


def standby_due_ms(fleet) -> float:
    """How long until a healthy standby is asked again (`fleets.core.heartbeat_cadence`)."""
    return standby_every(fleet_view(fleet).policy).total_seconds() * 1000


def gpu_errors(kind: str, status_label: str = "gpu_memory") -> float:
    return fleet_metrics.SUPERVISOR_CALL_ERRORS.labels(call=status_label, kind=kind)._value.get()


def test_heartbeat_stores_gpu_memory_beside_the_status(fleet, settle, fake_clock, hosts):
    asked_at = fake_clock.now()
    settle()

    west = report("west")
    [gpu] = west["gpus"]
    assert (gpu["index"], gpu["totalMiB"], gpu["name"]) == (0, TOTAL_MIB, "NVIDIA H100 80GB HBM3")
    assert gpu["usedMiB"] == 2 * CONTEXT_MIB + TRAINER_MIB
    assert {p["pid"] for p in gpu["processes"]} == {
        *hosts.hosts["west"].model_pids.values(),
        hosts.hosts["west"].pid,
    }
    assert west["gpusAt"] == asked_at.isoformat().replace("+00:00", "Z")
    assert "gpusError" not in west
    # The status is still there, normalized, with the heartbeat's stamp.
    assert west["slots"][1]["training"]["state"] == "running"
    assert west["heartbeat"]["ok"] is True
    assert report("east")["gpus"][0]["usedMiB"] == 2 * WEIGHTS_MIB


def test_stored_gpu_memory_draws_awake_sleeping_and_training_bars(fleet, settle):
    settle()

    page = fleet_page(fleet, now=Domain.objects.get(slug="west").last_seen_at)

    cards = {c["slug"]: c for c in page["domains"]}
    [west] = cards["west"]["gpus"]
    assert [(s.kind, s.mib) for s in west.segments] == [
        ("sleeping", 2 * CONTEXT_MIB),
        ("training", TRAINER_MIB),
    ]
    [east] = cards["east"]["gpus"]
    assert [(s.kind, s.mib) for s in east.segments] == [("awake", 2 * WEIGHTS_MIB)]
    assert east.used_pct == round(100 * 2 * WEIGHTS_MIB / TOTAL_MIB, 1)


def test_a_hung_gpu_read_never_delays_the_heartbeats_decisions(
    fleet, tick, hosts, domains, fake_clock
):
    east = hosts.hosts["east"]
    east.gpu_gate = threading.Event()  # east's GPU read hangs until released
    east.models["qwen-small"] = True  # and east is not fully awake: a state decision to make
    asked_at = fake_clock.now()
    try:
        started = time.perf_counter()
        tick()
        tick()
        elapsed = time.perf_counter() - started
        # Decided at once, without the GPU answer (the gate holds it for up to 10 s).
        assert elapsed < 2.0
        assert Domain.objects.get(slug="east").state == "degraded"
        assert "gpus" not in report("east")
        # One read in flight per domain: the second beat joined it instead of asking again.
        assert east.calls["GET /v1/gpu/memory"] == 1
    finally:
        east.gpu_gate.set()
    wait_for_reads(domains)
    fake_clock.advance(ms=100)
    tick()  # the late answer is stored by the next beat, dated when it was asked
    assert report("east")["gpus"][0]["usedMiB"] == WEIGHTS_MIB + CONTEXT_MIB
    assert report("east")["gpusAt"] == asked_at.isoformat().replace("+00:00", "Z")
    assert east.calls["GET /v1/gpu/memory"] == 1


def test_no_gpu_facts_is_an_answer_not_a_failed_heartbeat(fleet, settle, hosts):
    hosts.hosts["west"].gpu_unavailable = True
    errors_before = gpu_errors("http")

    settle()

    west = report("west")
    assert "gpus" not in west
    assert west["gpusError"]["status"] == 501
    assert west["heartbeat"]["ok"] is True
    assert Domain.objects.get(slug="west").state == "ready"
    assert not Event.objects.filter(kind="domain.heartbeat.failed").exists()
    assert gpu_errors("http") == errors_before  # not counted as a failing call


@pytest.mark.parametrize(("fault", "kind"), [("gpu_fails", "http"), ("gpu_bad_body", "bad_body")])
def test_a_failed_gpu_read_keeps_the_last_bars_and_says_why(
    fleet, settle, hosts, fake_clock, fault, kind
):
    settle()
    before = report("west")
    setattr(hosts.hosts["west"], fault, True)
    fake_clock.advance(ms=heartbeat.GPU_MEMORY_IDLE_EVERY_MS)

    settle()

    west = report("west")
    assert (west["gpus"], west["gpusAt"]) == (before["gpus"], before["gpusAt"])
    assert west["gpusError"]["kind"] == kind
    assert west["heartbeat"]["ok"] is True
    assert Domain.objects.get(slug="west").state == "ready"


def test_a_status_failure_decides_reachability_whatever_the_gpu_read_says(
    fleet, tick, hosts, fake_clock
):
    tick()
    hosts.hosts["west"].bad_body = True  # every answer off the contract, the GPU one included
    fake_clock.advance(ms=standby_due_ms(fleet))  # a healthy standby is asked at that pace
    tick()
    assert Domain.objects.get(slug="west").state == "degraded"
    assert report("west")["heartbeat"]["ok"] is False


def test_gpu_reads_are_spaced_per_domain(fleet, settle, tick, hosts, fake_clock, domains):
    settle()
    asked = hosts.hosts["west"].calls["GET /v1/gpu/memory"]
    for _ in range(3):
        fake_clock.advance(ms=100)
        tick()
    assert hosts.hosts["west"].calls["GET /v1/gpu/memory"] == asked
    fake_clock.advance(ms=heartbeat.GPU_MEMORY_IDLE_EVERY_MS)
    asked_at = fake_clock.now()
    settle()
    assert hosts.hosts["west"].calls["GET /v1/gpu/memory"] == asked + 1
    assert report("west")["gpusAt"] == asked_at.isoformat().replace("+00:00", "Z")


def test_gpu_memory_is_not_asked_of_a_host_whose_heartbeat_fails(
    fleet, settle, tick, hosts, fake_clock
):
    settle()
    west = hosts.hosts["west"]
    west.down = True
    fake_clock.advance(ms=heartbeat.GPU_MEMORY_IDLE_EVERY_MS)
    settle()  # the first failing beat still asked (both calls leave together)
    asked = west.calls["GET /v1/gpu/memory"]
    for _ in range(3):
        fake_clock.advance(ms=heartbeat.GPU_MEMORY_IDLE_EVERY_MS)
        tick()
    assert west.calls["GET /v1/gpu/memory"] == asked  # only the status call, once a beat
    assert report("west")["heartbeat"]["ok"] is False

    west.down = False
    settle()  # status good again: GPU memory from the standby's next beat that records
    fake_clock.advance(ms=standby_due_ms(fleet))
    settle()
    assert west.calls["GET /v1/gpu/memory"] == asked + 1
    assert "gpusError" not in report("west")


def test_training_checkpoint_time_reaches_the_dashboard_unchanged(fleet, tick, hosts, fake_clock):
    at = "2025-12-31T23:58:00Z"  # two minutes before the fake clock's start
    hosts.hosts["west"].checkpoint_at = at

    tick()

    training = report("west")["slots"][1]["training"]
    assert training["lastCheckpointAt"] == at
    page = fleet_page(fleet, now=fake_clock.now())
    [slot] = next(c for c in page["domains"] if c["slug"] == "west")["training"]
    assert slot["checkpoint_at"] == at
    assert slot["checkpoint_age"] == "2m 00s"
