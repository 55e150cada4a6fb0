"""An idle fleet's tick: six statements with the lease, no row written but the lease's (a
heartbeat that changed nothing keeps its sighting on the lease's give-back, and every freshness
reader takes it in), healthy standbys asked at their own pace, and an outage still dated by the
last good heartbeat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleets.core.heartbeat_cadence import GPU_MEMORY_IDLE_EVERY_MS, record_every, standby_every
from fleets.dashboard.selectors import fleet_page
from fleets.models import Domain, Fleet, Lease, ModelBinding, Operation, Slot
from fleets.reads import sightings
from fleets.reads.fleet_list import every_fleet_rows
from fleets.reads.selectors import fleet_snapshot, fleet_view
from fleets.reads.tick_snapshot import lookback, tick_snapshot
from fleets.reconciler import heartbeat
from fleets.reconciler.locks import TickLease, tick_lease_name, tick_lease_s
from fleets.reconciler.tick import fleet_tick, tick_run
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


def test_an_idle_tick_writes_only_the_lease_however_long_its_hosts_go_unchanged(
    fleet, fake_clock, hosts
):
    # Ticks a sixth of heartbeatStaleMs apart, past the old record pace (a third of it), the
    # standby's own beats and the stale window itself: each six statements, the lease's two
    # rows only.
    settled(fleet, fake_clock)
    policy = fleet_view(fleet).policy
    step_ms = policy.heartbeat_stale_ms / 6
    ticks = 8
    assert ticks * step_ms > policy.heartbeat_stale_ms
    assert ticks * step_ms > max(record_every(policy), standby_every(policy)).total_seconds() * 1000
    asked = hosts.hosts["west"].calls["GET /v1/status"]
    for _ in range(ticks):
        fake_clock.advance(ms=step_ms)
        # The demo fleet has no golden baselines: keep their probe (a write of its own, once a
        # minute) from falling due inside this window.
        Fleet.objects.filter(pk=fleet.pk).update(baseline_probe_at=fake_clock.now())
        with CaptureQueriesContext(connection) as queries:
            assert ticked(fleet).ran
        sent = [q["sql"] for q in queries if not q["sql"].startswith(("BEGIN", "SAVEPOINT"))]
        assert len(sent) <= 6, "\n".join(sent)
        writes = writes_of(queries)
        assert len(writes) == 2, "\n".join(writes)
        assert all("fleets_lease" in sql for sql in writes)
    assert hosts.hosts["west"].calls["GET /v1/status"] > asked  # the standby was asked too


def test_an_unchanged_heartbeat_writes_no_row_and_every_reader_sees_it_fresh(fleet, fake_clock):
    settled(fleet, fake_clock)
    east = Domain.objects.get(slug="east")
    policy = fleet_view(fleet).policy
    fake_clock.advance(seconds=policy.heartbeat_stale_ms / 1000 + 5)
    heard = fake_clock.now()
    ticked(fleet)
    # The row is as it was: the sighting is on the lease.
    assert Domain.objects.get(pk=east.pk).last_seen_at == east.last_seen_at
    kept = sightings.decode(Lease.objects.get(name=tick_lease_name(fleet.id)).sightings)
    assert kept[str(east.pk)] == heard
    # The core's view (failover, readiness), the API's snapshot, the list and the page.
    view = fleet_view(fleet)
    assert next(d for d in view.domains if d.slug == "east").last_seen_at == heard
    api = fleet_snapshot(Fleet.objects.get(pk=fleet.pk))
    assert next(d for d in api["domains"] if d["slug"] == "east")["lastSeenAt"].startswith(
        heard.strftime("%Y-%m-%dT%H:%M:%S")
    )
    listed = every_fleet_rows()
    row = next(d for d in listed.domains[fleet.pk] if d.slug == "east")
    assert row.last_seen_at == heard
    snapshot = tick_snapshot(fleet.id)
    assert snapshot is not None
    assert next(d for d in snapshot.domains if d.slug == "east").last_seen_at == heard
    page = fleet_page(Fleet.objects.get(pk=fleet.pk), now=heard)
    card = next(d for d in page["domains"] if d["slug"] == "east")
    assert (card["heartbeat_age"], card["stale"]) == ("0.0s", False)


def test_the_metrics_read_the_heartbeat_age_from_the_lease_sighting(fleet, fake_clock, client):
    settled(fleet, fake_clock)
    fake_clock.advance(seconds=fleet_view(fleet).policy.heartbeat_stale_ms / 1000 + 5)
    ticked(fleet)  # east heard, its row not written
    text = client.get("/metrics").content.decode()
    assert 'haru_domain_heartbeat_age_seconds{domain="east",fleet="demo"} 0.0' in text


def test_a_tick_without_a_lease_records_an_unchanged_sighting_when_due(fleet, fake_clock):
    # Nowhere to keep it: the row is written at the old pace, a third of heartbeatStaleMs.
    settled(fleet, fake_clock)
    east = Domain.objects.get(slug="east")
    policy = fleet_view(fleet).policy
    fake_clock.advance(seconds=record_every(policy).total_seconds())
    fleet_tick(fleet_id=fleet.id, poll_s=0)
    assert Domain.objects.get(pk=east.pk).last_seen_at > east.last_seen_at


def test_a_failure_seen_by_another_process_is_dated_from_the_lease_sighting(
    fleet, fake_clock, hosts
):
    settled(fleet, fake_clock)
    fake_clock.advance(ms=100)
    last_good = fake_clock.now()
    ticked(fleet)  # a good beat, kept on the lease only
    heartbeat._unrecorded.clear()  # the next tick runs in another worker
    hosts.hosts["east"].down = True
    fake_clock.advance(ms=100)
    ticked(fleet)
    east = Domain.objects.get(slug="east")
    assert east.heartbeat_failing_since is not None
    assert east.last_seen_at == last_good


def test_sightings_of_domains_gone_are_dropped_from_the_lease(fleet, fake_clock):
    settled(fleet, fake_clock)
    name = tick_lease_name(fleet.id)
    Lease.objects.filter(name=name).update(
        sightings={"00000000-0000-0000-0000-000000000001": "2026-01-01T00:00:00+00:00"}
    )
    fake_clock.advance(ms=100)
    ticked(fleet)
    kept = Lease.objects.get(name=name).sightings
    assert "00000000-0000-0000-0000-000000000001" not in kept
    assert set(kept) <= {str(d.pk) for d in Domain.objects.filter(fleet=fleet)}


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
        # The domains' last_seen_at takes the lease's sightings in, as every reader does.
        domains = sightings.overlaid(list(Domain.objects.filter(fleet_id=fleet.id)), [fleet.id])
        for got, model, rows in (
            (snapshot.domains, Domain, domains),
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


def _gpu_reads_answered(fleet) -> None:
    for d in Domain.objects.filter(fleet=fleet):
        read = heartbeat.pending_gpu_read(d.id)
        if read is not None:
            read.future.result(timeout=10)


def _a_minute_since_gpus_were_read(fleet, fake_clock) -> None:
    """As if the last GPU memory reading were a minute old (the clock itself is not moved, so
    the heartbeats' own pace is not disturbed): the row's time and this process's."""
    Domain.objects.filter(fleet=fleet).update(
        gpus_read_at=fake_clock.now() - timedelta(milliseconds=GPU_MEMORY_IDLE_EVERY_MS + 1)
    )
    heartbeat._gpu_asked.clear()


def test_idle_gpu_memory_is_read_once_a_minute_and_written_only_when_it_differs(
    fleet, fake_clock, hosts
):
    settled(fleet, fake_clock)
    _gpu_reads_answered(fleet)
    fake_clock.advance(ms=100)
    ticked(fleet)  # stores any reading that came in late
    east = hosts.hosts["east"]

    # Due, and the memory is as stored: read, not written.
    _a_minute_since_gpus_were_read(fleet, fake_clock)
    asked = east.calls["GET /v1/gpu/memory"]
    for _ in range(2):
        fake_clock.advance(ms=100)
        with CaptureQueriesContext(connection) as queries:
            ticked(fleet)
        _gpu_reads_answered(fleet)
        assert all("fleets_lease" in sql for sql in writes_of(queries))
    assert east.calls["GET /v1/gpu/memory"] == asked + 1  # the second tick did not ask again

    # Due, and the memory moved: written.
    east.leak_mib = 1234
    _a_minute_since_gpus_were_read(fleet, fake_clock)
    stored = Domain.objects.get(slug="east").last_report["gpus"][0]["usedMiB"]
    for _ in range(2):
        fake_clock.advance(ms=100)
        ticked(fleet)
        _gpu_reads_answered(fleet)
    assert Domain.objects.get(slug="east").last_report["gpus"][0]["usedMiB"] == stored + 1234


def test_an_operation_keeps_its_sources_last_sighting_from_the_lease(fleet, fake_clock, domains):
    settled(fleet, fake_clock)
    fake_clock.advance(ms=100)
    heard = fake_clock.now()
    ticked(fleet)  # east heard, its row not written
    assert Domain.objects.get(slug="east").last_seen_at < heard
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    assert Operation.objects.get(pk=op.operation.id).source_seen_at == heard


def test_the_snapshot_reads_a_changed_row_anew(fleet, fake_clock):
    # Conversions are remembered per row while it comes back unchanged: a row written
    # meanwhile (a JSON column, a state) must read as written.
    settled(fleet, fake_clock)
    assert tick_snapshot(fleet.id) is not None
    east = Domain.objects.get(slug="east")
    Domain.objects.filter(pk=east.pk).update(last_report={"changed": True}, state="degraded")
    Slot.objects.filter(domain=east).update(pids=[4242])
    snapshot = tick_snapshot(fleet.id)
    assert snapshot is not None
    got = next(d for d in snapshot.domains if d.pk == east.pk)
    assert (got.last_report, got.state) == ({"changed": True}, "degraded")
    assert all(s.pids == [4242] for s in snapshot.slots if s.domain_id == east.pk)
