"""Failed automatic failovers back off per target, with the clock injected."""

from __future__ import annotations

import pytest

from fleets.models import Event, Fleet, Operation
from fleets.reads.selectors import fleet_snapshot
from fleets.services.operations import operation_cancel

pytestmark = pytest.mark.django_db


def lose_the_active(tick, hosts, fake_clock) -> None:
    tick()
    hosts.hosts["east"].down = True
    tick()
    fake_clock.advance(ms=3001)  # heartbeatStaleMs of the demo policy


def attempts() -> list[Operation]:
    return list(Operation.objects.filter(reason="auto_failover").order_by("created_at"))


def set_policy(fleet, **keys) -> None:
    fleet.policy = {**fleet.policy, **keys}
    fleet.save(update_fields=["policy"])


def test_a_standby_whose_probe_fails_gets_a_few_attempts_a_minute(fleet, tick, hosts, fake_clock):
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    lose_the_active(tick, hosts, fake_clock)

    for _ in range(60):  # a minute of one-second ticks
        tick()
        fake_clock.advance(ms=1000)

    made = attempts()
    assert all(op.state == "failed" for op in made)
    # Defaults: 15 s, then 30 s, then 60 s: attempts at about 0, 15, 45 s.
    assert len(made) == 3
    gaps = [
        (b.created_at - a.finished_at).total_seconds() for a, b in zip(made, made[1:], strict=False)
    ]
    assert 15 <= gaps[0] < 17 and 30 <= gaps[1] < 32
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 1


def test_the_backoff_is_visible_in_the_api_and_held_ticks_record_why(
    fleet, tick, hosts, fake_clock, domains
):
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    lose_the_active(tick, hosts, fake_clock)
    tick()
    failed = attempts()[0]
    assert failed.state == "failed"

    snapshot = fleet_snapshot(fleet)
    west = next(d for d in snapshot["domains"] if d["slug"] == "west")
    assert west["failoverBackoff"]["failures"] == 1
    assert west["failoverBackoff"]["nextAttemptAt"].startswith(
        (failed.finished_at.replace(microsecond=0)).strftime("%Y-%m-%dT%H:%M")
    )
    east = next(d for d in snapshot["domains"] if d["slug"] == "east")
    assert east["failoverBackoff"] is None

    fake_clock.advance(ms=1000)
    tick()
    report = Event.objects.filter(kind="failover.no_viable_standby").latest("id")
    assert report.data["reason"] == "failover_backoff"
    assert report.data["nextAttemptAt"] == west["failoverBackoff"]["nextAttemptAt"]


def test_the_backoff_follows_the_policy_keys(fleet, tick, hosts, fake_clock):
    set_policy(fleet, failoverBackoffMs=2000, failoverBackoffMaxMs=4000)
    hosts.hosts["west"].probe_fails = {"qwen-small"}
    lose_the_active(tick, hosts, fake_clock)
    for _ in range(20):
        tick()
        fake_clock.advance(ms=1000)
    made = attempts()
    gaps = [
        (b.created_at - a.finished_at).total_seconds() for a, b in zip(made, made[1:], strict=False)
    ]
    # Doubled, then capped. Each gap is the backoff plus at most one tick's time: the ticks are
    # a second apart and each spends some of the fake clock (the data-path confirmation's
    # second check, a probe's wait), so an attempt lands in the first tick after its backoff.
    assert len(gaps) >= 3, gaps
    for gap, backoff in zip(gaps, [2, 4, 4], strict=False):
        assert backoff <= gap < backoff + 1.5, gaps


def test_a_success_ends_the_backoff(fleet, tick, hosts, fake_clock):
    west = hosts.hosts["west"]
    west.probe_fails = {"qwen-small"}
    lose_the_active(tick, hosts, fake_clock)
    tick()
    assert attempts()[0].state == "failed"
    west.probe_fails = set()
    fake_clock.advance(ms=15_000)
    for _ in range(10):  # the dead old active's best-effort steps run out their budgets
        tick()
        fake_clock.advance(ms=5000)
    assert attempts()[-1].state == "succeeded"
    snapshot = fleet_snapshot(fleet)
    assert all(d["failoverBackoff"] is None for d in snapshot["domains"])


def test_an_operator_cancel_of_an_automatic_failover_sticks(fleet, tick, hosts, fake_clock):
    hosts.hosts["west"].stop_polls = 1000  # keeps the promotion in flight
    lose_the_active(tick, hosts, fake_clock)
    tick()
    first = attempts()[0]
    assert first.state == "running"
    assert operation_cancel(operation_id=first.id, actor="ops")

    tick()
    fake_clock.advance(ms=1000)
    tick()
    assert len(attempts()) == 1  # not asked again at once
