"""The provisioning phase table (every pair) and the replacement and retry decisions."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.policy import Policy
from fleets.core.provisioning import (
    PHASE_TRANSITIONS,
    PHASES_OF_STATE,
    Phase,
    ReplaceCandidate,
    backoff_over,
    budget_spent,
    check_phase,
    next_candidate,
    should_replace,
    stop_mode,
)
from fleets.core.states import DomainState, InvalidTransition

# Written from the module's description, not from the table under test.
ALLOWED = """
    (none) -> launch replace teardown
    replace -> launch teardown
    launch -> wait backoff teardown
    wait -> up backoff teardown
    backoff -> launch teardown
    up -> settled replace teardown
    settled -> replace teardown
    teardown -> launch replace
"""
EXPECTED = set()
for line in ALLOWED.strip().splitlines():
    src, dsts = line.split("->")
    src = src.strip()
    EXPECTED |= {("" if src == "(none)" else src, d) for d in dsts.split()}
SOURCES = ["", *[p.value for p in Phase]]
ALL_PAIRS = list(itertools.product(SOURCES, [p.value for p in Phase]))


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS)
def test_every_phase_pair_is_allowed_exactly_when_the_spec_says(src, dst):
    if (src, dst) in EXPECTED:
        check_phase(src, dst)
    else:
        with pytest.raises(InvalidTransition):
            check_phase(src, dst)


def test_the_table_has_no_pair_outside_the_spec():
    table = {(s, d.value) for s, dsts in PHASE_TRANSITIONS.items() for d in dsts}
    assert table == EXPECTED


def test_an_unknown_phase_is_refused():
    with pytest.raises(InvalidTransition):
        check_phase("flying", "launch")


def test_every_domain_state_lists_its_phases():
    assert set(PHASES_OF_STATE) == {s.value for s in DomainState}
    assert PHASES_OF_STATE[DomainState.STOPPING] == {Phase.TEARDOWN}
    assert Phase.SETTLED not in PHASES_OF_STATE[DomainState.PROVISIONING]


NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = Policy.resolve({"provisionTimeoutMs": 60_000, "replaceFailedGraceMs": 10_000})


def test_budget_is_spent_exactly_at_the_timeout():
    assert not budget_spent(started_at=NOW, now=NOW + timedelta(seconds=59), policy=POLICY)
    assert budget_spent(started_at=NOW, now=NOW + timedelta(seconds=60), policy=POLICY)
    assert not budget_spent(started_at=None, now=NOW, policy=POLICY)


@pytest.mark.parametrize(
    ("current", "count", "elsewhere", "expected"),
    [(0, 3, True, 1), (2, 3, True, 0), (1, 3, False, 1), (0, 1, True, 0), (5, 3, False, 2)],
)
def test_next_candidate_moves_on_only_for_capacity(current, count, elsewhere, expected):
    assert next_candidate(current, count, retry_elsewhere=elsewhere) == expected


def test_next_candidate_needs_a_candidate():
    with pytest.raises(ValueError):
        next_candidate(0, 0, retry_elsewhere=True)


def test_backoff_is_over_at_its_time():
    assert backoff_over(next_attempt_at=None, now=NOW)
    assert not backoff_over(next_attempt_at=NOW + timedelta(seconds=1), now=NOW)
    assert backoff_over(next_attempt_at=NOW, now=NOW)


def failed(**kw) -> ReplaceCandidate:
    base = dict(
        state=DomainState.FAILED,
        managed=True,
        is_active=False,
        was_active=False,
        failed_since=NOW - timedelta(seconds=11),
    )
    return ReplaceCandidate(**{**base, **kw})


def test_a_failed_standby_is_replaced_after_the_grace():
    assert should_replace(failed(), now=NOW, policy=POLICY) == "replace_failed_standby"


def test_a_failed_former_active_is_replaced_under_its_own_switch():
    assert should_replace(failed(was_active=True), now=NOW, policy=POLICY) == (
        "replace_failed_active"
    )
    off = Policy.resolve({"replaceFailedActive": False, "replaceFailedGraceMs": 10_000})
    assert should_replace(failed(was_active=True), now=NOW, policy=off) is None
    assert should_replace(failed(), now=NOW, policy=off) == "replace_failed_standby"


def test_standby_replacement_can_be_switched_off():
    off = Policy.resolve({"replaceFailedStandby": False, "replaceFailedGraceMs": 10_000})
    assert should_replace(failed(), now=NOW, policy=off) is None


@pytest.mark.parametrize(
    "change",
    [
        {"managed": False},
        {"is_active": True},
        {"state": DomainState.DEGRADED},
        {"state": DomainState.STOPPED},
        {"failed_since": NOW - timedelta(seconds=9)},
        {"failed_since": None},
    ],
)
def test_no_replacement_for_static_active_live_or_fresh_failures(change):
    assert should_replace(failed(**change), now=NOW, policy=POLICY) is None


def test_stop_mode_prefers_the_domain_setting():
    assert stop_mode(domain_mode=None, policy=Policy()) == "down"
    assert stop_mode(domain_mode="stop", policy=Policy()) == "stop"
    assert stop_mode(domain_mode=None, policy=Policy.resolve({"stopMode": "stop"})) == "stop"
