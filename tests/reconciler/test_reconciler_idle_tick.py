"""An idle fleet's tick: six statements with the lease, no row written but the lease's, healthy
standbys asked at their own pace, and an outage still dated by the last good heartbeat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleets.core.heartbeat_cadence import record_every, standby_every
from fleets.models import Domain, Fleet, Lease, ModelBinding, Operation, Slot
from fleets.reads.selectors import fleet_view
from fleets.reads.tick_snapshot import lookback, tick_snapshot
from fleets.reconciler.locks import TickLease, tick_lease_name, tick_lease_s
from fleets.reconciler.tick import tick_run
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db

WRITES = ("INSERT", "UPDATE", "DELETE")


def ticked(fleet, *, poll_s: float = 0):
    return tick_run(fleet_id=fleet.id, poll_s=poll_s)


def settled(fleet, fake_clock) -> None:
    """Tick until the fleet is idle: the first beats mirror what the hosts report."""
    for _ in range(3):
        assert ticked(fleet).ran
        fake_clock.advance(ms=50)


def writes_of(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(WRITES)]


def test_an_idle_tick_sends_six_statements_and_writes_only_the_lease(fleet, fake_clock):
    settled(fleet, fake_clock)
    fake_clock.advance(ms=100)  # no sighting due, no standby due
    with CaptureQueriesContext(connection) as queries:
        assert ticked(fleet).ran
    sent = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "SAVEPOINT"))]
    assert len(sent) <= 6, "\n".join(sent)
    writes = writes_of(queries)
    assert len(writes) == 2  # the lease: taken, given back
    assert all("fleets_lease" in sql for sql in writes)


def test_an_unchanged_heartbeat_writes_no_row_until_its_sighting_is_due(fleet, fake_clock):
    settled(fleet, fake_clock)
    east = Domain.objects.get(slug="east")
    policy = fleet_view(fleet).policy
    fake_clock.advance(ms=100)
    ticked(fleet)
    assert Domain.objects.get(pk=east.pk).last_seen_at == east.last_seen_at

    fake_clock.advance(seconds=record_every(policy).total_seconds())
    ticked(fleet)
    assert Domain.objects.get(pk=east.pk).last_seen_at > east.last_seen_at


def test_a_healthy_standby_is_asked_at_its_own_pace_the_active_every_tick(fleet, fake_clock, hosts):
    settled(fleet, fake_clock)
    policy = fleet_view(fleet).policy
    west, east = hosts.hosts["west"], hosts.hosts["east"]
    asked_west, asked_east = west.calls["GET /v1/status"], east.calls["GET /v1/status"]
    for _ in range(3):
        fake_clock.advance(ms=100)
        ticked(fleet)
    assert east.calls["GET /v1/status"] == asked_east + 3
    assert west.calls["GET /v1/status"] == asked_west

    fake_clock.advance(seconds=standby_every(policy).total_seconds())
    ticked(fleet)
    assert west.calls["GET /v1/status"] == asked_west + 1


def test_every_domain_is_asked_every_tick_once_the_active_is_not_ready(fleet, fake_clock, hosts):
    settled(fleet, fake_clock)
    hosts.hosts["east"].servers_down = {"qwen-small"}
    hosts.hosts["east"].models["qwen-small"] = True  # asleep: the active is not fully awake
    fake_clock.advance(ms=100)
    ticked(fleet)
    assert Domain.objects.get(slug="east").state == "degraded"
    west = hosts.hosts["west"]
    asked = west.calls["GET /v1/status"]
    fake_clock.advance(ms=100)
    ticked(fleet)
    assert west.calls["GET /v1/status"] == asked + 1


def test_a_failure_after_unrecorded_beats_dates_the_outage_from_the_last_good_one(
    fleet, fake_clock, hosts
):
    settled(fleet, fake_clock)
    fake_clock.advance(ms=100)
    last_good = fake_clock.now()
    ticked(fleet)  # a good beat, not recorded
    east = Domain.objects.get(slug="east")
    assert east.last_seen_at < last_good

    hosts.hosts["east"].down = True
    fake_clock.advance(ms=100)
    ticked(fleet)
    east = Domain.objects.get(slug="east")
    assert east.heartbeat_failing_since is not None
    assert east.last_seen_at == last_good


def test_taking_a_free_lease_is_one_statement_that_names_whom_it_took_over_from(fleet, fake_clock):
    name = tick_lease_name(fleet.id)
    first = TickLease(name, tick_lease_s())
    assert first.try_take()  # creates the row
    fake_clock.advance(seconds=tick_lease_s() + 1)  # the first holder froze
    second = TickLease(name, tick_lease_s())
    with CaptureQueriesContext(connection) as queries:
        assert second.try_take()
    assert len(queries) == 1
    assert second.taken_over_from == first.holder
    assert second.last_held_at == fake_clock.now() - timedelta(seconds=tick_lease_s() + 1)
    row = Lease.objects.get(name=name)
    assert (row.holder, row.previous_holder) == (second.holder, first.holder)


def test_a_fleet_with_a_recent_operation_takes_the_full_path_until_it_is_quiet_again(
    fleet, fake_clock, domains
):
    settled(fleet, fake_clock)
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    Operation.objects.filter(pk=op.operation.id).update(
        state="succeeded", finished_at=fake_clock.now()
    )
    fake_clock.advance(ms=100)
    with CaptureQueriesContext(connection) as queries:
        ticked(fleet)
    assert len(queries) > 6  # backoff, damping and restore read what the operation left

    fake_clock.advance(seconds=lookback(fleet_view(fleet).policy).total_seconds())
    settled(fleet, fake_clock)
    fake_clock.advance(ms=100)
    with CaptureQueriesContext(connection) as queries:
        ticked(fleet)
    assert len([q for q in queries if not q["sql"].startswith(("BEGIN", "SAVEPOINT"))]) <= 6


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.fields}


def test_the_snapshot_reads_each_row_as_the_orm_does(fleet, fake_clock):
    # The snapshot turns rows into instances itself (the raw queryset's per-run set-up was
    # most of its CPU): every field, JSON and times included, must read as the ORM reads it,
    # on every run, not only the first.
    settled(fleet, fake_clock)
    for _ in range(2):
        snapshot = tick_snapshot(fleet.id)
        assert snapshot is not None
        assert _fields(snapshot.fleet) == _fields(Fleet.objects.get(pk=fleet.id))
        for got, model, rows in (
            (snapshot.domains, Domain, Domain.objects.filter(fleet_id=fleet.id)),
            (snapshot.slots, Slot, Slot.objects.filter(domain__fleet_id=fleet.id)),
            (
                snapshot.bindings,
                ModelBinding,
                ModelBinding.objects.filter(domain__fleet_id=fleet.id),
            ),
        ):
            assert got and all(type(g) is model for g in got)
            assert sorted(map(_fields, got), key=str) == sorted(map(_fields, rows), key=str)
            assert all(not g._state.adding for g in got)  # saved rows, as from_db marks them
    assert snapshot.fleet.open_operation in (False, 0)  # annotations ride along
    assert snapshot.view.active is not None
