"""A control plane that is stopping starts no failover, and an operation it leaves resumes with
honest step times (issue 28: "a false failover when the control plane stops").

`make demo`'s Ctrl-C stopped the server and both supervisors at once; the server's loop, still
ticking while it drained, saw both hosts refuse, failed the active and started a promotion. The
next start resumed it with `stop_training` recorded as 72 s (budget 15 s). Scripted hosts under
a fake clock here; tests/e2e/test_e2e_stop.py does the same with real processes.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from fleets.base import stopping
from fleets.core.resume import away_for, resumed_step_start
from fleets.models import Event, Lease, Operation
from fleets.reconciler.locks import tick_lease_name, tick_lease_s
from fleets.reconciler.supervisor import transport
from fleets.reconciler.tick import tick_run
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _not_stopping():
    stopping.reset()
    yield
    stopping.reset()


def both_hosts_gone(hosts) -> None:
    for host in hosts.hosts.values():
        host.down = True


def stop_at_call(hosts, n: int) -> list[str]:
    """Route calls to the scripted hosts; just before the n-th (1: the first heartbeat) the
    control plane begins to stop and both hosts go down with it. Return the calls seen."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url}")
        if len(seen) == n:
            stopping.begin()
            both_hosts_gone(hosts)
        return hosts.handle(request)

    transport.use_transport(httpx.MockTransport(handle))
    return seen


def assert_nothing_written(domains) -> None:
    assert not Operation.objects.exists()
    assert not Event.objects.filter(kind="domain.failed").exists()
    assert not Event.objects.filter(kind__startswith="operation.").exists()
    assert domains()["east"].state == "ready"


def test_a_stopping_process_runs_no_tick(fleet, tick, hosts, domains):
    tick()  # both hosts seen healthy
    both_hosts_gone(hosts)
    stopping.begin()

    result = tick_run(fleet_id=fleet.id, poll_s=0)

    assert result.ran is False
    assert_nothing_written(domains)


@pytest.mark.parametrize("n", [1, 2])
def test_a_tick_the_stop_interrupts_writes_nothing_it_saw(
    fleet, tick, hosts, domains, n, standby_due
):
    # The stop begins inside the heartbeat round (one status call per host), and the hosts stop
    # with the control plane: every call from then on is refused.
    tick()
    standby_due()  # both hosts are asked this round, the healthy standby too
    seen = stop_at_call(hosts, n)

    result = tick_run(fleet_id=fleet.id, poll_s=0)

    assert len(seen) >= n  # the stop did begin inside this tick
    assert result.ran is False
    assert_nothing_written(domains)


def test_a_stop_during_the_confirmation_fails_nothing(fleet, tick, hosts, domains):
    # Both hosts refuse the heartbeat (their processes stopping a moment before the control
    # plane's): the tick confirms with two more rounds, and the stop begins meanwhile. The
    # round's refusals are written as they are (degraded, models down), but the active is not
    # failed and nothing is promoted.
    tick()
    both_hosts_gone(hosts)
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if len(seen) == 6:  # inside the confirmation's first round
            stopping.begin()
        return hosts.handle(request)

    transport.use_transport(httpx.MockTransport(handle))

    assert tick_run(fleet_id=fleet.id, poll_s=0).ran is False
    assert len(seen) > 6
    assert domains()["east"].state != "failed"
    assert not Operation.objects.exists()
    assert not Event.objects.filter(kind="domain.failed").exists()


def test_the_same_tick_without_a_stop_fails_over(fleet, tick, hosts, domains):
    # The control: what the tests above keep from happening is what a running control plane
    # does when both hosts refuse.
    tick()
    both_hosts_gone(hosts)

    tick_run(fleet_id=fleet.id, poll_s=0)

    assert domains()["east"].state == "failed"
    assert Operation.objects.get().reason == "auto_failover"


def test_an_operation_in_flight_is_left_to_resume_not_judged(fleet, tick, hosts, fake_clock):
    tick()
    west = hosts.hosts["west"]
    west.stop_polls = 1000  # the trainer takes its time: the promotion waits in stop_training
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west_id(fleet)).operation
    assert op is not None
    tick()
    assert Operation.objects.get(pk=op.id).current_step == "stop_training"
    both_hosts_gone(hosts)
    stopping.begin()
    fake_clock.advance(ms=60_000)  # far past the step's budget

    tick_run(fleet_id=fleet.id, poll_s=0)

    op.refresh_from_db()
    assert (op.state, op.current_step) == ("running", "stop_training")
    assert not Event.objects.filter(kind__in=["operation.failed", "operation.step.retry"]).exists()


def west_id(fleet):
    return fleet.domains.get(slug="west").id


def test_a_resumed_step_is_not_charged_the_time_the_control_plane_was_away(
    fleet, hosts, domains, fake_clock
):
    tick_run(fleet_id=fleet.id, poll_s=0)
    west = hosts.hosts["west"]
    west.stop_polls = 1000
    hosts.hosts["east"].down = True  # the active's host is gone: a real failover starts
    tick_run(fleet_id=fleet.id, poll_s=0)
    op = Operation.objects.get()
    assert (op.reason, op.current_step) == ("auto_failover", "stop_training")
    fake_clock.advance(ms=1500)  # the trainer's stop has run 1.5 s
    tick_run(fleet_id=fleet.id, poll_s=0)
    # The control plane goes away for a minute (stopped, or down with a rack), then returns.
    fake_clock.advance(ms=60_000)
    west._stopping_left = 0  # the trainer's stop completes at the next status read
    for _ in range(40):
        fake_clock.advance(ms=100)
        tick_run(fleet_id=fleet.id, poll_s=0)
        op.refresh_from_db()
        if op.routing_committed or op.state != "running":
            break

    assert op.routing_committed and op.error is None
    resumed = Event.objects.get(operation=op, kind="operation.resumed")
    assert resumed.step == "stop_training"
    assert resumed.data["awayMs"] >= 60_000
    stopped = Event.objects.get(operation=op, kind="operation.step.done", step="stop_training")
    assert stopped.duration_ms is not None and stopped.duration_ms < 3_000
    # What clients saw still counts the whole absence: the failover figure is untouched.
    switched = Event.objects.get(operation=op, kind="operation.step.done", step="switch_route")
    assert switched.data["failoverMs"] >= 60_000


def test_a_short_gap_between_ticks_is_not_an_absence(fleet, hosts, fake_clock):
    tick_run(fleet_id=fleet.id, poll_s=0)
    hosts.hosts["west"].stop_polls = 1000
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west_id(fleet)).operation
    assert op is not None
    tick_run(fleet_id=fleet.id, poll_s=0)
    started = Operation.objects.get(pk=op.id).step_started_at

    fake_clock.advance(ms=int(tick_lease_s() * 1000) - 1000)  # quiet, but less than a lease
    tick_run(fleet_id=fleet.id, poll_s=0)

    assert Operation.objects.get(pk=op.id).step_started_at == started
    assert not Event.objects.filter(kind="operation.resumed").exists()


def test_a_released_lease_keeps_when_it_was_given_back(fleet, fake_clock):
    tick_run(fleet_id=fleet.id, poll_s=0)
    released = Lease.objects.get(name=tick_lease_name(fleet.id))
    assert released.holder == "" and released.expires_at == fake_clock.now()


def test_away_counts_only_past_the_threshold_and_the_step_keeps_what_it_ran(fake_clock):
    now = fake_clock.now()
    lease = timedelta(seconds=15)
    assert away_for(None, now, lease) == timedelta(0)
    assert away_for(now - timedelta(seconds=10), now, lease) == timedelta(0)
    assert away_for(now - timedelta(seconds=70), now, lease) == timedelta(seconds=70)
    held = now - timedelta(seconds=70)
    # Ran 2 s before the control plane went away: resumes with those 2 s on its clock.
    assert resumed_step_start(held - timedelta(seconds=2), held, now) == now - timedelta(seconds=2)
    # Started after the last moment known held (a holder that died): starts again from zero.
    assert resumed_step_start(held + timedelta(seconds=1), held, now) == now
