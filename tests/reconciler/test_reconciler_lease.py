"""The tick lease: one tick per fleet, taken over once a frozen holder's lease runs out, and a
holder that lost it writes nothing more (issue 11, finding 11)."""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import OperationalError, connection

from fleets.core.dispatch import PERIODIC_SKIP_SHARE
from fleets.models import Lease, Operation
from fleets.reconciler import locks
from fleets.reconciler.locks import (
    LeaseLost,
    TickLease,
    fleet_tick_lock,
    tick_lease_name,
    tick_lease_s,
)
from fleets.reconciler.tick import LEASE_RETRY_SLACK_MS, fleet_tick, tick_run
from fleets.services.leases import lease_acquire
from fleets.services.operations import operation_request


def _frozen_holder(fleet_id) -> TickLease:
    """A holder that took the fleet's lease and then stopped (never renews, never releases)."""
    lease = TickLease(tick_lease_name(fleet_id), tick_lease_s())
    assert lease.try_take()
    return lease


@pytest.mark.django_db
def test_a_held_lease_skips_the_tick_and_says_when_it_runs_out(fleet, fake_clock):
    holder = _frozen_holder(fleet.id)
    fake_clock.advance(seconds=4)
    result = tick_run(fleet_id=fleet.id, poll_s=0)
    assert result.ran is False
    # Look again when the holder's lease runs out, not a whole beat later.
    expected = int((tick_lease_s() - 4) * 1000) + LEASE_RETRY_SLACK_MS
    assert result.nudge_ms == expected
    assert Lease.objects.get(name=tick_lease_name(fleet.id)).holder == holder.holder


@pytest.mark.django_db
def test_a_frozen_holder_is_taken_over_one_lease_later(fleet, domains, fake_clock):
    frozen = _frozen_holder(fleet.id)
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    fake_clock.advance(seconds=tick_lease_s() - 0.5)
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran is False  # not yet

    fake_clock.advance(seconds=1)
    taken = tick_run(fleet_id=fleet.id, poll_s=0)
    assert taken.ran is True
    assert Operation.objects.get(pk=op.operation.id).state != "pending"  # the new holder acted

    # The frozen holder wakes: its next checkpoint renews, finds the lease gone, and stops.
    assert not frozen.held()
    with pytest.raises(LeaseLost):
        frozen.check()


@pytest.mark.django_db
def test_a_holder_that_lost_its_lease_writes_nothing_more(fleet, domains, fake_clock):
    frozen = _frozen_holder(fleet.id)
    fake_clock.advance(seconds=tick_lease_s() + 1)
    # Another worker takes the fleet (and stays in the middle of its own tick).
    assert lease_acquire(
        name=tick_lease_name(fleet.id),
        holder="other",
        now=fake_clock.now(),
        ttl=timedelta(seconds=tick_lease_s()),
    ).acquired
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    with pytest.raises(LeaseLost):
        fleet_tick(fleet_id=fleet.id, poll_s=0, checkpoint=frozen.check)
    # Stopped at its first checkpoint, after the heartbeat round and before any state write.
    assert Operation.objects.get(pk=op.operation.id).state == "pending"
    assert Lease.objects.get(name=tick_lease_name(fleet.id)).holder == "other"


@pytest.mark.django_db
def test_a_running_holder_renews_and_keeps_the_fleet(fleet, fake_clock):
    with fleet_tick_lock(fleet.id) as lease:
        assert lease
        for _ in range(4):  # well past the first deadline, renewing at each checkpoint
            fake_clock.advance(seconds=tick_lease_s() / 2)
            lease.check()
        assert lease.held()
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran is False
    # Released at the end of the block: free at once, no waiting for the deadline.
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran is True


@pytest.mark.django_db
def test_a_holder_that_cannot_renew_in_time_is_not_held(fleet, fake_clock):
    with fleet_tick_lock(fleet.id) as lease:
        fake_clock.advance(seconds=tick_lease_s())
        # Without a confirmed renewal it cannot tell whether someone took over: not held.
        assert not lease.held()
        lease.check()  # nobody did: the renewal confirms it again
        assert lease.held()


@pytest.mark.django_db
def test_two_acquisitions_in_one_thread_exclude_each_other(fleet):
    with fleet_tick_lock(fleet.id) as first, fleet_tick_lock(fleet.id) as second:
        assert first and not second


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_lease_needs_no_session_state(fleet):
    # Behind a transaction-mode pooler each statement may run on another server connection:
    # closing ours between the take and the release must not let anyone else in. (A
    # session-level advisory lock would have gone with the connection.)
    with fleet_tick_lock(fleet.id) as lease:
        assert lease
        connection.close()
        with fleet_tick_lock(fleet.id) as other:
            assert not other
        connection.close()
        lease.check()
    connection.close()
    assert Lease.objects.get(name=tick_lease_name(fleet.id)).holder == ""


@pytest.mark.django_db
def test_a_holder_process_of_this_host_that_died_is_taken_over_at_once(fleet, fake_clock):
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its PID names no process now
    dead = f"{locks._HOST}:{gone.pid}:deadbeef0000"
    alive = f"{locks._HOST}:{os.getpid()}:cafe00000000"
    elsewhere = f"other-host:4026531836:{gone.pid}:deadbeef0000"
    for holder, taken in ((alive, False), (elsewhere, False), (dead, True)):
        Lease.objects.update_or_create(
            name=tick_lease_name(fleet.id),
            defaults={
                "holder": holder,
                "expires_at": fake_clock.now() + timedelta(seconds=tick_lease_s()),
            },
        )
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran is taken, holder


@pytest.mark.django_db
def test_a_killed_holder_not_yet_reaped_counts_as_gone(fleet, fake_clock):
    child = subprocess.Popen(["sleep", "60"])
    try:
        child.kill()
        for _ in range(100):  # killed, not waited for: a zombie
            if Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert locks.local_and_dead(f"{locks._HOST}:{child.pid}:feed00000000")
    finally:
        child.wait()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_tick_cut_off_by_a_database_restart_gives_its_lease_back(fleet):
    # A restart terminates every connection: the tick fails on its broken connection, and the
    # release retries once on a fresh one instead of leaving the fleet held for a lease.
    with fleet_tick_lock(fleet.id) as lease:
        assert lease
        with pytest.raises(OperationalError), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    assert Lease.objects.get(name=tick_lease_name(fleet.id)).holder == ""


@pytest.mark.django_db
def test_a_periodic_tick_passes_over_a_fleet_another_worker_just_ticked(fleet, fake_clock):
    # Two loops share the fleets: the one whose beat comes second in an interval leaves the
    # fleet to the one that just ticked it, and comes back one interval after that tick.
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran  # the other worker's tick
    fake_clock.advance(seconds=1)
    skipped = tick_run(fleet_id=fleet.id, poll_s=0, periodic_s=5.0)
    assert skipped.ran is False
    assert skipped.nudge_ms == 4000 + LEASE_RETRY_SLACK_MS
    # A kick, or a waiting step's nudge, is never passed over.
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran
    # Past the share of the interval (PERIODIC_SKIP_SHARE) after the last tick: taken.
    fake_clock.advance(seconds=5 * PERIODIC_SKIP_SHARE + 0.01)
    assert tick_run(fleet_id=fleet.id, poll_s=0, periodic_s=5.0).ran


@pytest.mark.django_db
def test_a_periodic_take_still_takes_over_a_holder_that_ran_out(fleet, fake_clock):
    _frozen_holder(fleet.id)  # took it a moment ago, then froze
    fake_clock.advance(seconds=1)
    held = tick_run(fleet_id=fleet.id, poll_s=0, periodic_s=5.0)
    assert held.ran is False
    assert held.nudge_ms == int((tick_lease_s() - 1) * 1000) + LEASE_RETRY_SLACK_MS
    fake_clock.advance(seconds=tick_lease_s())
    assert tick_run(fleet_id=fleet.id, poll_s=0, periodic_s=5.0).ran


@pytest.mark.django_db
def test_an_idle_tick_holds_the_quiet_share_of_the_lease_and_a_busy_one_the_whole(
    fleet, fake_clock
):
    # A worker that dies in an idle tick hands the fleet over in the quiet share of the lease.
    name = tick_lease_name(fleet.id)
    quiet = locks.quiet_lease_s()
    assert quiet == tick_lease_s() / 2  # the default 15 s: 7.5 s
    idle = TickLease(name, tick_lease_s(), first_ttl_s=quiet)
    assert idle.try_take()
    row = Lease.objects.get(name=name)
    assert row.expires_at == fake_clock.now() + timedelta(seconds=quiet)
    # Leaving the quiet path: the whole lease from now, in one statement.
    fake_clock.advance(seconds=1)
    idle.widen()
    row.refresh_from_db()
    assert row.expires_at == fake_clock.now() + timedelta(seconds=tick_lease_s())
    idle.widen()  # already whole: nothing more
    idle.release()

    frozen = TickLease(name, tick_lease_s(), first_ttl_s=quiet)
    assert frozen.try_take()  # took it for an idle tick, then froze
    fake_clock.advance(seconds=quiet - 0.5)
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran is False
    fake_clock.advance(seconds=1)
    assert tick_run(fleet_id=fleet.id, poll_s=0).ran  # half a lease, not a whole one


@pytest.mark.django_db
def test_a_checkpoint_past_a_third_of_the_quiet_lease_renews_it_whole(fleet, fake_clock):
    name = tick_lease_name(fleet.id)
    lease = TickLease(name, tick_lease_s(), first_ttl_s=locks.quiet_lease_s())
    assert lease.try_take()
    fake_clock.advance(seconds=locks.quiet_lease_s() / 3 + 0.1)
    lease.check()
    assert Lease.objects.get(name=name).expires_at == fake_clock.now() + timedelta(
        seconds=tick_lease_s()
    )


@pytest.mark.django_db
def test_the_tick_widens_its_lease_only_when_it_leaves_the_quiet_path(fleet, domains, fake_clock):
    widened = []
    for _ in range(3):  # the first ticks record what the hosts report: not idle
        fleet_tick(fleet_id=fleet.id, poll_s=0)
        fake_clock.advance(ms=50)
    fleet_tick(fleet_id=fleet.id, poll_s=0, widen=lambda: widened.append("idle"))
    assert widened == []  # idle: the quiet share of the lease is enough
    operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    fleet_tick(fleet_id=fleet.id, poll_s=0, widen=lambda: widened.append("busy"))
    assert widened == ["busy"]


def test_the_quiet_lease_never_falls_under_one_heartbeat_round():
    assert locks.quiet_lease_for(15) == 7.5
    assert locks.quiet_lease_for(8) == locks.QUIET_LEASE_MIN_S  # half would be 4 s
    assert locks.quiet_lease_for(4) == 4  # never longer than the lease itself
