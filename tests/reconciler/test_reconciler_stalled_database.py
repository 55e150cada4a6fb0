"""A slow database delays a tick but never fails over a healthy active (issue 11, finding 6).

Liveness is judged as of the heartbeat round's own observation (when its answers were in, on the
control plane's clock), not when the tick got to write them.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from fleets.models import Domain, Fleet, Operation
from fleets.reconciler.tick import fleet_tick, tick_run

# The demo policy's heartbeatStaleMs is 3000: every stall below is longer.
STALL_S = 4.5


def _routing(fleet_id) -> tuple:
    return Fleet.objects.filter(pk=fleet_id).values_list("active_domain_id", "route_revision").get()


@pytest.mark.django_db
def test_a_stalled_heartbeat_write_does_not_fail_over_a_healthy_active(fleet, fake_clock):
    before = _routing(fleet.id)
    stalled = []

    def stall(execute, sql, params, many, context):
        # The database takes 10 s to accept the first heartbeat write (a held write lock, a
        # long transaction): the clock moves on while the supervisor's answer was fresh.
        if sql.startswith('UPDATE "fleets_domain"') and not stalled:
            stalled.append(sql)
            fake_clock.advance(seconds=10)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(stall):
        fleet_tick(fleet_id=fleet.id, poll_s=0)
    assert stalled
    assert _routing(fleet.id) == before
    assert not Operation.objects.filter(fleet=fleet).exists()
    # The next round (prompt, answered) still sees a healthy active.
    fleet_tick(fleet_id=fleet.id, poll_s=0)
    assert _routing(fleet.id) == before
    assert not Operation.objects.filter(fleet=fleet).exists()


@pytest.mark.django_db
def test_an_active_that_stops_answering_is_still_failed_over(fleet, hosts, fake_clock):
    # The other side: judging by the round's observation must not hide a real loss.
    fleet_tick(fleet_id=fleet.id, poll_s=0)
    hosts.hosts["east"].down = True
    fake_clock.advance(seconds=4)
    fleet_tick(fleet_id=fleet.id, poll_s=0)
    op = Operation.objects.get(fleet=fleet)
    assert op.kind == "promote" and op.reason == "auto_failover"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_row_lock_longer_than_the_staleness_window_moves_no_routing(seeded_fleet, hosts):
    # Real clock, real lock: another session holds the active's row for longer than
    # heartbeatStaleMs while its supervisor keeps answering.
    fleet = seeded_fleet
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran
    before = _routing(fleet.id)
    active_id = before[0]
    # A heartbeat that changed nothing writes no row (its sighting goes with the lease): the
    # active reports something new (its trainer's first checkpoint), so the tick below writes
    # the locked row.
    hosts.hosts["east"].checkpoint_at = "2026-01-01T00:00:00Z"
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("SELECT id FROM fleets_domain WHERE id = %s FOR UPDATE", [active_id])
                locked.set()
                time.sleep(STALL_S)
                cursor.execute("COMMIT")
        finally:
            other.close()
            done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran
        waited = time.monotonic() - started
    finally:
        holder.join(STALL_S + 10)
    assert waited >= STALL_S - 0.5, "the tick did not wait for the lock: nothing was tested"
    assert _routing(fleet.id) == before
    assert not Operation.objects.filter(fleet=fleet).exists()
    assert Domain.objects.get(pk=active_id).state == "ready"
