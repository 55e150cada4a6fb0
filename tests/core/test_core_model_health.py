"""Per-model serving health, the proxy's servable rule, and the data-path verdict: full tables."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.failover import ACTIVE_STALE, detect_failover
from fleets.core.mirror import ModelPosture
from fleets.core.model_health import (
    Reach,
    ServerHealth,
    Verdict,
    is_model_servable,
    model_health,
    needs_direct_check,
    outage_started_at,
    serving_recently,
    unreachable_verdict,
)
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView, SlotView
from fleets.core.states import DomainState, InferenceState

P, R, H = ModelPosture, Reach, ServerHealth
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def _expected_health(answered: bool, posture: ModelPosture, direct: Reach) -> ServerHealth | None:
    # The table, written out independently of the implementation's branch order.
    if answered and posture == P.AWAKE:
        return H.UP
    if answered and posture == P.ASLEEP:
        return H.DOWN
    return {R.ANSWERED: H.UP, R.REFUSED: H.DOWN, R.UNAVAILABLE: H.DOWN}.get(direct)


@pytest.mark.parametrize(
    ("answered", "posture", "direct"), list(itertools.product([True, False], P, R))
)
def test_model_health_table(answered, posture, direct):
    got = model_health(supervisor_answered=answered, posture=posture, direct=direct)
    assert got == _expected_health(answered, posture, direct)


@pytest.mark.parametrize(
    ("answered", "posture", "needed"),
    [
        (True, P.AWAKE, False),
        (True, P.ASLEEP, False),
        (True, P.UNKNOWN, True),
        (True, P.MISSING, True),
        *[(False, p, True) for p in P],
    ],
)
def test_a_model_server_is_asked_directly_only_when_its_supervisor_cannot_say(
    answered, posture, needed
):
    assert needs_direct_check(supervisor_answered=answered, posture=posture) is needed


def test_a_timeout_is_no_news_whatever_the_supervisor_did_not_say():
    # A partition must not flip a serving model to down: the stale window judges it.
    assert model_health(supervisor_answered=False, posture=P.MISSING, direct=R.TIMEOUT) is None


def _servable_expected(domain: str, slot: str, health: str) -> bool:
    if health == H.DOWN:
        return False
    if slot == InferenceState.SERVING and domain in (DomainState.READY, DomainState.DEGRADED):
        return True
    return (
        health == H.UP
        and slot in (InferenceState.SERVING, InferenceState.FAILED)
        and domain in (DomainState.READY, DomainState.DEGRADED, DomainState.FAILED)
    )


@pytest.mark.parametrize(
    ("domain", "slot", "health"), list(itertools.product(DomainState, InferenceState, H))
)
def test_servable_table(domain, slot, health):
    assert is_model_servable(domain, slot, health) is _servable_expected(domain, slot, health)


def test_the_issues_cases_read_as_the_issue_says():
    # Only the supervisor died: its slot reads failed, the domain degraded, the model is up.
    assert is_model_servable(DomainState.DEGRADED, InferenceState.FAILED, H.UP)
    # A neighbour on the slot died: the slot is failed, this model's own server is up.
    assert is_model_servable(DomainState.DEGRADED, InferenceState.FAILED, H.UP)
    # The dead neighbour itself is refused.
    assert not is_model_servable(DomainState.DEGRADED, InferenceState.FAILED, H.DOWN)
    # Its own server down, even on a slot the control plane still calls serving.
    assert not is_model_servable(DomainState.READY, InferenceState.SERVING, H.DOWN)
    # Never observed yet (a fresh fleet): the slot state decides, as before.
    assert is_model_servable(DomainState.READY, InferenceState.SERVING, H.UNKNOWN)
    assert not is_model_servable(DomainState.READY, InferenceState.FAILED, H.UNKNOWN)


@pytest.mark.parametrize(
    ("supervisor", "models"),
    list(itertools.product(R, [(), *[(m,) for m in R], *itertools.product(R, repeat=2)])),
)
def test_unreachable_verdict_table(supervisor, models):
    got = unreachable_verdict(supervisor, list(models))
    if supervisor == R.REFUSED and models and all(m == R.REFUSED for m in models):
        assert got == Verdict.GONE
    elif supervisor == R.TIMEOUT or R.TIMEOUT in models:
        assert got == Verdict.SLOW
    elif R.REFUSED in models or R.UNAVAILABLE in models:
        assert got == Verdict.MODELS_DOWN
    else:
        assert got == Verdict.FINE


def test_only_refusals_everywhere_prove_a_host_gone():
    assert unreachable_verdict(R.REFUSED, [R.REFUSED, R.REFUSED]) == Verdict.GONE
    # One model server still answers: the host is there.
    assert unreachable_verdict(R.REFUSED, [R.REFUSED, R.ANSWERED]) == Verdict.MODELS_DOWN
    # The supervisor answers: model servers down are degraded, with a grace.
    assert unreachable_verdict(R.ANSWERED, [R.REFUSED, R.REFUSED]) == Verdict.MODELS_DOWN
    # A partition times out: the stale window decides, never the data path.
    assert unreachable_verdict(R.TIMEOUT, [R.TIMEOUT, R.TIMEOUT]) == Verdict.SLOW
    assert unreachable_verdict(R.REFUSED, [R.REFUSED, R.TIMEOUT]) == Verdict.SLOW
    # Nothing to check: no proof.
    assert unreachable_verdict(R.REFUSED, []) != Verdict.GONE


@pytest.mark.parametrize(
    ("ages_ms", "expected"),
    [
        ([], False),
        ([None], False),
        ([2999], True),
        ([3000], True),
        ([3001], False),
        ([None, 10_000, 100], True),
        ([-5], False),  # from the future (a skewed writer): not evidence
    ],
)
def test_serving_recently(ages_ms, expected):
    seen = [None if a is None else NOW - timedelta(milliseconds=a) for a in ages_ms]
    assert serving_recently(seen, now=NOW, window_ms=3000) is expected


def test_outage_starts_at_the_last_good_sighting_or_the_first_failed_request():
    t = [NOW - timedelta(seconds=s) for s in (5, 3, 1)]
    assert outage_started_at([t[0], t[1]], None) == t[1]  # the latest good sighting
    assert outage_started_at([t[0], t[2]], t[1]) == t[1]  # a failed request before it wins
    assert outage_started_at([t[0]], t[2]) == t[0]  # a failed request after it does not
    assert outage_started_at([None], t[2]) == t[2]
    assert outage_started_at([None], None) is None


def _fleet(active_seen_ms: int, serving_seen_ms: int | None) -> FleetView:
    seen = NOW - timedelta(milliseconds=active_seen_ms)
    served = None if serving_seen_ms is None else NOW - timedelta(milliseconds=serving_seen_ms)
    east = DomainView(
        id="east",
        slug="east",
        state=DomainState.DEGRADED,
        supervisor_url="http://east:8701",
        last_seen_at=seen,
        slots=(SlotView("e0", 0, "inference", InferenceState.FAILED),),
        models=(ModelView("qwen", "http://east:9000", "e0", 0, "failed", H.UP, served),),
    )
    west = DomainView(
        id="west",
        slug="west",
        state=DomainState.READY,
        supervisor_url="http://west:8701",
        last_seen_at=NOW,
        slots=(SlotView("w0", 0, "inference", InferenceState.SLEEPING),),
        models=(ModelView("qwen", "http://west:9000", "w0", 0, "sleeping"),),
    )
    return FleetView(
        id="f",
        slug="f",
        active_domain_id="east",
        route_revision=1,
        policy=Policy(auto_failover=True, heartbeat_stale_ms=3000),
        domains=(east, west),
    )


def test_staleness_alone_never_fails_over_an_active_whose_model_servers_serve():
    # Supervisor silent for 10 s, its model server seen serving 500 ms ago: no failover.
    assert detect_failover(_fleet(10_000, 500), NOW) is None
    # Its model servers not seen for longer than the window either: stale, fail over.
    decision = detect_failover(_fleet(10_000, 4_000), NOW)
    assert decision is not None and decision.reason == ACTIVE_STALE
    assert detect_failover(_fleet(10_000, None), NOW).reason == ACTIVE_STALE
