"""Backoff of failed automatic failovers: per target, doubling, capped, ended by a success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.backoff import Attempt, backoff_delay_ms, failover_backoffs, held_targets
from fleets.core.failover import FAILOVER_BACKOFF, FailoverDecision, detect_failover
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = Policy(failover_backoff_ms=10_000, failover_backoff_max_ms=60_000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("failures", "ms"),
    [(0, 0), (1, 10_000), (2, 20_000), (3, 40_000), (4, 60_000), (5, 60_000), (10_000, 60_000)],
)
def test_delay_doubles_per_failure_up_to_the_cap(failures, ms):
    assert backoff_delay_ms(failures, POLICY) == ms


def test_consecutive_failures_of_one_target_count_from_the_newest():
    attempts = [  # newest first
        Attempt("b", "failed", at(30)),
        Attempt("b", "cancelled", at(20)),
        Attempt("b", "failed", at(10)),
    ]
    backoff = failover_backoffs(attempts, POLICY)["b"]
    assert backoff.failures == 3
    assert backoff.next_attempt_at == at(30 + 40)


def test_targets_back_off_independently():
    attempts = [Attempt("b", "failed", at(30)), Attempt("c", "failed", at(20))]
    got = failover_backoffs(attempts, POLICY)
    assert (got["b"].failures, got["c"].failures) == (1, 1)
    assert got["c"].next_attempt_at == at(30)


def test_a_success_ends_the_episode_for_every_target():
    attempts = [
        Attempt("b", "failed", at(100)),
        Attempt("c", "succeeded", at(50)),
        Attempt("b", "failed", at(40)),
        Attempt("b", "failed", at(30)),
    ]
    assert failover_backoffs(attempts, POLICY)["b"].failures == 1
    assert failover_backoffs([Attempt("b", "succeeded", at(9))], POLICY) == {}


def test_an_attempt_in_flight_closes_the_run():
    attempts = [Attempt("b", "running", None), Attempt("b", "failed", at(10))]
    assert failover_backoffs(attempts, POLICY) == {}


def test_held_targets_are_those_not_yet_due():
    backoffs = failover_backoffs([Attempt("b", "failed", at(0))], POLICY)
    assert held_targets(backoffs, at(9.999)) == {"b": at(10)}
    assert held_targets(backoffs, at(10)) == {}


def _domain(slug: str) -> DomainView:
    return DomainView(
        id=slug,
        slug=slug,
        state="ready",
        supervisor_url=f"http://{slug}",
        last_seen_at=at(0),
        models=(ModelView("m", "http://x", "s", 0, "sleeping"),),
    )


def test_failover_passes_over_a_held_standby_and_reports_backoff_when_none_is_left():
    policy = Policy(auto_failover=True, heartbeat_stale_ms=3_600_000)
    dead = DomainView(id="a", slug="a", state="failed", last_seen_at=at(0))
    f = FleetView("f", "prod", "a", 1, policy, (dead, _domain("b"), _domain("c")))
    now = at(1)
    assert detect_failover(f, now) == FailoverDecision("b", "active_failed")
    assert detect_failover(f, now, {"b": at(5)}) == FailoverDecision("c", "active_failed")
    assert detect_failover(f, now, {"b": at(5), "c": at(5)}) == FailoverDecision(
        None, FAILOVER_BACKOFF
    )
