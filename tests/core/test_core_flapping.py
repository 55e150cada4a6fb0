"""Flap damping: counting a fleet's recent automatic failovers, and holding the next one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from fleets.core.failover import FAILOVER_DAMPED, FailoverDecision, detect_failover
from fleets.core.flapping import damped_hold, flap_damping, hold_down_ms
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView

NOW = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
POLICY = Policy(auto_failover=True)  # window 10 min, 2 failovers, hold-down 30 s


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_one_failover_in_the_window_does_not_damp():
    assert flap_damping([ago(5)], POLICY, NOW) is None
    assert flap_damping([], POLICY, NOW) is None


def test_two_failovers_in_the_window_damp_until_the_older_ages_out():
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    assert damping is not None
    assert damping.failovers == 2
    assert damping.last_at == ago(20)
    assert damping.until == ago(100) + timedelta(minutes=10)
    assert damping.confirm_ms == 30_000


def test_failovers_older_than_the_window_are_not_counted():
    assert flap_damping([ago(601), ago(20)], POLICY, NOW) is None
    edge = flap_damping([ago(600), ago(20)], POLICY, NOW)
    assert edge is not None and edge.until == NOW


def test_each_failover_past_the_threshold_doubles_the_hold_down_up_to_the_window():
    assert [hold_down_ms(n, POLICY) for n in (1, 2, 3, 4, 5)] == [
        30_000,
        30_000,
        60_000,
        120_000,
        240_000,
    ]
    assert hold_down_ms(50, POLICY) == POLICY.flap_window_ms
    damping = flap_damping([ago(300), ago(200), ago(100), ago(10)], POLICY, NOW)
    assert damping is not None and damping.confirm_ms == 120_000
    # Until it drops below two: every one but the newest must age out.
    assert damping.until == ago(100) + timedelta(minutes=10)


def test_zero_max_failovers_switches_damping_off():
    off = Policy(auto_failover=True, flap_max_failovers=0)
    assert flap_damping([ago(s) for s in range(1, 20)], off, NOW) is None


def test_a_commit_stamped_in_the_future_counts_as_now():
    damping = flap_damping([ago(-30), ago(10)], POLICY, NOW)
    assert damping is not None and damping.last_at == NOW


def test_a_damped_failover_waits_until_the_active_was_lost_for_the_hold_down():
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    assert damped_hold(damping, ago(29), NOW)
    assert not damped_hold(damping, ago(30), NOW)
    assert damped_hold(damping, None, NOW)  # never seen: lost from now
    assert not damped_hold(None, ago(0), NOW)


def _fleet(active_state: str, last_seen: datetime) -> FleetView:
    model = ModelView("qwen", "http://a:9000", "s0", 0, "serving")
    active = DomainView(
        "id-a", "a", active_state, supervisor_url="http://a", last_seen_at=last_seen,
        models=(model,),
    )  # fmt: skip
    standby = DomainView(
        "id-b", "b", "ready", supervisor_url="http://b", last_seen_at=ago(1),
        models=(ModelView("qwen", "http://b:9000", "s1", 0, "sleeping"),),
    )  # fmt: skip
    return FleetView("f", "prod", "id-a", 5, POLICY, (active, standby))


def test_detect_failover_answers_damped_while_the_active_just_went_down():
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    fleet = _fleet("failed", ago(3))
    assert detect_failover(fleet, NOW) == FailoverDecision("id-b", "active_failed")
    assert detect_failover(fleet, NOW, damping=damping) == FailoverDecision(None, FAILOVER_DAMPED)
    # An earlier failed request is earlier evidence of the outage.
    assert detect_failover(fleet, NOW, damping=damping, first_failed_request=ago(31)) == (
        FailoverDecision("id-b", "active_failed")
    )


def test_detect_failover_goes_ahead_once_the_active_stayed_lost_for_the_hold_down():
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    assert detect_failover(_fleet("failed", ago(31)), NOW, damping=damping) == (
        FailoverDecision("id-b", "active_failed")
    )


def test_damping_never_invents_a_failover():
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    assert detect_failover(_fleet("ready", ago(1)), NOW, damping=damping) is None


def test_a_failed_active_whose_supervisor_still_answers_is_lost_since_it_failed():
    # Its models are down (asleep after a restart): its heartbeats go on, so the last one is
    # no measure of how long it has been lost; the move to failed is.
    damping = flap_damping([ago(100), ago(20)], POLICY, NOW)
    fleet = _fleet("failed", ago(1))
    for since, expected in ((ago(5), FailoverDecision(None, FAILOVER_DAMPED)),
                            (ago(31), FailoverDecision("id-b", "active_failed"))):  # fmt: skip
        active = replace(fleet.domains[0], state_since=since)
        held = replace(fleet, domains=(active, fleet.domains[1]))
        assert detect_failover(held, NOW, damping=damping) == expected
