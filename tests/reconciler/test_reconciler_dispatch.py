"""Dispatch at scale: one plan for all fleets per interval, batched Celery messages, and the
in-process loop deferring fleets another process holds or has just ticked."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta

import pytest

from fleets import tasks
from fleets.base import clock
from fleets.models import Fleet, Lease
from fleets.reconciler import locks
from fleets.reconciler import loop as loop_module
from fleets.reconciler.dispatch import dispatch_plan
from fleets.reconciler.locks import tick_lease_name
from fleets.reconciler.loop import ReconcileLoop
from fleets.reconciler.tick import LEASE_RETRY_SLACK_MS, TickResult
from fleets.services.leases import lease_acquire, lease_release

OTHER_HOST = "worker-b:4026532176:812:9c1f2e7a3b4d"


def _fleets(count: int, start: int = 0) -> list[str]:
    return [str(Fleet.objects.create(slug=f"scale-{start + n}").id) for n in range(count)]


def _held(fleet_id: str, *, for_s: float, since_s: float = 0.0) -> None:
    taken = lease_acquire(
        name=tick_lease_name(fleet_id),
        holder=OTHER_HOST,
        now=clock.now() - timedelta(seconds=since_s),
        ttl=timedelta(seconds=for_s + since_s),
    )
    assert taken.acquired


def _given_back(fleet_id: str, *, ago_s: float) -> None:
    """Another worker's tick of the fleet started `ago_s` ago and took 50 ms."""
    _held(fleet_id, for_s=15, since_s=ago_s)
    when = clock.now() - timedelta(seconds=ago_s - 0.05)
    assert lease_release(name=tick_lease_name(fleet_id), holder=OTHER_HOST, now=when)


@pytest.mark.django_db
def test_the_plan_puts_each_fleet_by_its_lease(fake_clock):
    held, recent, long_ago, never = _fleets(4)
    _held(held, for_s=12)
    _given_back(recent, ago_s=1)
    _given_back(long_ago, ago_s=30)

    plan = dispatch_plan(None, interval_s=5)

    assert sorted(plan.now) == sorted([long_ago, never])
    assert plan.held == {held: 12.0}
    assert plan.recent == {recent: 4.0}


@pytest.mark.django_db
def test_the_plan_ticks_at_once_a_fleet_whose_holder_on_this_host_is_gone(fake_clock):
    # A worker of this host killed mid-tick: its fleet is sent now, and the tick takes the
    # lease over as gone, instead of waiting out the lease (or the dead task's redelivery).
    gone, alive = _fleets(2)
    child = subprocess.Popen(["true"])
    child.wait()  # exited and reaped: its PID is free
    for fleet_id, holder in ((gone, f"{locks._HOST}:{child.pid}:feed00000000"),
                             (alive, f"{locks._HOST}:{os.getpid()}:feed00000001")):  # fmt: skip
        taken = lease_acquire(
            name=tick_lease_name(fleet_id), holder=holder, now=clock.now(),
            ttl=timedelta(seconds=15),
        )  # fmt: skip
        assert taken.acquired

    plan = dispatch_plan(None, interval_s=5)

    assert plan.now == [gone]
    assert plan.held == {alive: 15.0}


@pytest.mark.django_db
def test_the_plan_costs_two_queries_however_many_fleets(fake_clock, django_assert_num_queries):
    for fleet_id in _fleets(3):
        _given_back(fleet_id, ago_s=1)
    with django_assert_num_queries(2):
        small = dispatch_plan(None, interval_s=5)
    for fleet_id in _fleets(60, start=3):
        _held(fleet_id, for_s=10)
    with django_assert_num_queries(2):
        large = dispatch_plan(None, interval_s=5)
    assert len(small.ids()) == 3 and len(large.ids()) == 63
    assert len(large.held) == 60


@pytest.mark.django_db
def test_the_plan_names_only_the_selected_fleets(fake_clock):
    Fleet.objects.create(slug="other")
    chosen = Fleet.objects.create(slug="chosen")
    assert dispatch_plan(["chosen"], interval_s=5).now == [str(chosen.id)]


@pytest.mark.django_db
def test_beat_sends_one_message_per_batch_and_a_held_fleet_once_its_lease_runs_out(
    fake_clock, monkeypatch
):
    ids = _fleets(45)
    _held(ids[7], for_s=9)
    _given_back(ids[8], ago_s=0.5)  # a kick's follow-up just ticked it
    batches, kicks, provisions = [], [], []
    monkeypatch.setattr(
        tasks.reconcile_batch, "apply_async", lambda args, **kw: batches.append((args[0], kw))
    )
    monkeypatch.setattr(tasks.provision_fleet, "apply_async", lambda *a, **kw: provisions.append(a))
    monkeypatch.setattr(tasks, "celery_kicker", lambda fid, ms: kicks.append((fid, ms)))

    sent = tasks.reconcile_all()

    assert [len(batch) for batch, _ in batches] == [20, 20, 3]
    assert sorted(fid for batch, _ in batches for fid in batch) == sorted(sent)
    assert set(sent) == set(ids) - {ids[7], ids[8]}
    assert all(kw["expires"] == 5.0 for _, kw in batches)
    assert kicks == [(ids[7], 9000 + tasks.LEASE_RETRY_SLACK_MS)]
    assert provisions == []  # no fleet has a domain Haru provisions


@pytest.mark.django_db
def test_beat_sends_a_provisioning_pass_only_to_fleets_with_a_managed_domain(
    fleet, domains, monkeypatch
):
    _fleets(5)
    west = domains()["west"]
    west.provider = "skypilot"
    west.driver = {"cloud": "aws", "accelerators": "L4:1"}
    west.save(update_fields=["provider", "driver"])
    provisions = []
    monkeypatch.setattr(tasks.reconcile_batch, "apply_async", lambda *a, **kw: None)
    monkeypatch.setattr(
        tasks.provision_fleet, "apply_async", lambda args, **kw: provisions.append(args)
    )

    tasks.reconcile_all()

    assert provisions == [[str(fleet.id)]]


# Transactional: the loop closes its connection after each refresh, as between its ticks.
@pytest.mark.django_db(transaction=True)
def test_the_loop_runs_a_provisioning_pass_only_after_ticks_of_fleets_with_a_managed_domain(
    fleet, domains, monkeypatch
):
    others = _fleets(3)
    west = domains()["west"]
    west.provider = "skypilot"
    west.driver = {"cloud": "aws", "accelerators": "L4:1"}
    west.save(update_fields=["provider", "driver"])
    passes: list[str] = []
    monkeypatch.setattr(loop_module, "tick_run", lambda *, fleet_id: TickResult(fleet_id, True))
    monkeypatch.setattr(
        loop_module, "fleet_provision_tick", lambda *, fleet_id: passes.append(str(fleet_id))
    )
    loop = ReconcileLoop(interval_ms=5000)
    try:
        loop._refresh()
        for fleet_id in [*others, str(fleet.id)]:
            loop._running.add(fleet_id)
            loop._tick(fleet_id)
        loop._provision_pool.shutdown(wait=True)
    finally:
        loop.stop()
    assert passes == [str(fleet.id)]


# Transactional: the loop closes its connection after each refresh, as between its ticks.
@pytest.mark.django_db(transaction=True)
def test_the_loop_defers_a_fleet_another_process_holds_or_just_ticked(fake_clock):
    held, recent, free, kicked = _fleets(4)
    _held(held, for_s=12)
    _given_back(recent, ago_s=1)
    _given_back(kicked, ago_s=1)
    loop = ReconcileLoop(interval_ms=5000)
    try:
        loop.request(kicked)  # an operation's kick is never deferred by the periodic plan
        started = time.monotonic()
        loop._refresh()
        due = {fid: when - started for fid, when in loop._due.items()}
    finally:
        loop.stop()
    assert due[held] == pytest.approx(12 + LEASE_RETRY_SLACK_MS / 1000, abs=0.5)
    assert due[recent] == pytest.approx(4, abs=0.5)
    assert due[free] == pytest.approx(0, abs=0.5)
    assert due[kicked] == pytest.approx(0, abs=0.5)


# Transactional: the loop closes its connection after each refresh, as between its ticks.
@pytest.mark.django_db(transaction=True)
def test_the_loop_brings_a_deferred_fleet_forward_once_its_holder_gives_it_back(fake_clock):
    (fleet_id,) = _fleets(1)
    _held(fleet_id, for_s=15)
    loop = ReconcileLoop(interval_ms=5000)
    try:
        loop._refresh()
        assert loop._due[fleet_id] - time.monotonic() > 10  # waits for the lease's deadline
        # The holder (a live worker) finishes its tick at once; a few seconds pass.
        assert lease_release(name=tick_lease_name(fleet_id), holder=OTHER_HOST, now=clock.now())
        fake_clock.advance(seconds=3)
        loop._refresh()
        due = loop._due[fleet_id] - time.monotonic()
    finally:
        loop.stop()
    assert due == pytest.approx(0, abs=0.5)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_ticks_its_fleets_side_by_side_and_one_failure_stops_no_other(fleet, monkeypatch):
    broken = "6f1c0d52-93a4-4d0e-8f55-2f0c1f3e9b7a"
    real_tick = tasks.tick_run

    def tick_or_break(*, fleet_id):
        if fleet_id == broken:
            raise RuntimeError("this fleet's tick breaks")
        return real_tick(fleet_id=fleet_id)

    monkeypatch.setattr(tasks, "tick_run", tick_or_break)
    monkeypatch.setattr(tasks, "celery_kicker", lambda *args: None)
    results = {r["fleetId"]: r for r in tasks.reconcile_batch.run([broken, str(fleet.id)])}
    assert results[str(fleet.id)]["ran"] is True
    assert results[broken] == {"fleetId": broken, "ran": False, "error": True}
    assert Lease.objects.get(name=tick_lease_name(fleet.id)).holder == ""
