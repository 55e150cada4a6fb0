"""Pre-emption: every combination of failover outcome and in-flight operation, and every way an
ended operation ends, as tables."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.failover import FailoverDecision, detect_failover, lost_reason
from fleets.core.policy import Policy
from fleets.core.preemption import (
    Ending,
    InFlight,
    ending,
    leads_to_serving,
    should_preempt,
    steps_left,
)
from fleets.core.read_model import DomainView, FleetView, ModelView
from fleets.core.states import (
    DRILL_STEPS,
    PROMOTE_STEPS,
    ROUND_TRIP_DRILL_STEPS,
    DrillMode,
    steps_for,
)

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
FAILOVERS = {
    "active fine": None,
    "lost, nobody to promote": FailoverDecision(None, "no_viable_standby"),
    "lost, all backing off": FailoverDecision(None, "failover_backoff"),
    "lost, standby found": FailoverDecision("id-beta", "active_failed"),
}
KINDS = ["promote", "demote", "drill"]


def expected(failover: str, kind: str, serving: bool) -> bool:
    """The rule, spelt out: only a lost active with someone to promote pre-empts, and then
    everything except a promotion that will put (or keeps) a serving domain in front. Whether
    its routing committed is already in `serving` (see the leads_to_serving cases below)."""
    if failover != "lost, standby found":
        return False
    if kind in ("demote", "drill"):
        return True
    return not serving


CASES = list(itertools.product(FAILOVERS, KINDS, [False, True], [False, True]))


@pytest.mark.parametrize(("failover", "kind", "committed", "serving"), CASES)
def test_preemption_table(failover, kind, committed, serving):
    op = InFlight(kind=kind, target_id="id-gamma", routing_committed=committed)
    got = should_preempt(FAILOVERS[failover], op, leads_to_serving=serving)
    assert got is expected(failover, kind, serving)


def test_the_table_is_exhaustive():
    assert len(CASES) == 4 * 3 * 2 * 2


# -- how it ends: every kind, mode, step and commit flag -------------------------------------

PLANS = {
    ("promote", ""): PROMOTE_STEPS,
    ("demote", ""): steps_for("demote"),
    ("drill", DrillMode.CHECK): DRILL_STEPS,
    ("drill", DrillMode.ROUND_TRIP): ROUND_TRIP_DRILL_STEPS,
}
ENDING_CASES = [
    (kind, mode, step, committed)
    for (kind, mode), steps in PLANS.items()
    for step in ("", *steps)  # "": pending, no step yet
    for committed in (False, True)
]


def expected_ending(kind: str, step: str, committed: bool) -> Ending:
    """Spelt out: only a promotion that moved routing is not cancelled; it ends succeeded with
    the rest skipped once it is at a best-effort step, and not yet before (the instant between
    the pointer's CAS and the switch step's record). A drill never commits routing, whatever it
    moved: at every step it ends cancelled."""
    if kind != "promote" or not committed:
        return Ending.CANCEL
    return Ending.SKIP_REST if step in ("demote_old_sleep", "demote_old_train") else Ending.NOT_YET


@pytest.mark.parametrize(("kind", "mode", "step", "committed"), ENDING_CASES)
def test_ending_table(kind, mode, step, committed):
    op = InFlight(
        kind=kind, target_id="id-beta", routing_committed=committed, current_step=step,
        drill_mode=mode,
    )  # fmt: skip
    assert ending(op) is expected_ending(kind, step, committed)


def test_the_ending_table_is_exhaustive():
    assert len(ENDING_CASES) == 2 * sum(len(steps) + 1 for steps in PLANS.values())
    assert len(ENDING_CASES) == 2 * ((7 + 1) + (2 + 1) + (6 + 1) + (14 + 1))


@pytest.mark.parametrize(
    ("step", "left"),
    [
        ("demote_old_sleep", ("demote_old_sleep", "demote_old_train")),
        ("demote_old_train", ("demote_old_train",)),
        ("", ()),
    ],
)
def test_the_steps_left_are_the_current_one_and_all_after_it(step, left):
    op = InFlight(kind="promote", target_id="id-beta", routing_committed=True, current_step=step)
    assert steps_left(op) == left


def test_a_round_trip_drills_steps_left_come_from_its_own_plan():
    op = InFlight(
        kind="drill",
        target_id="id-beta",
        routing_committed=False,
        current_step="back_demote_old_sleep",
        drill_mode=DrillMode.ROUND_TRIP,
    )
    assert steps_left(op) == ("back_demote_old_sleep", "back_demote_old_train")


# -- leads to serving --------------------------------------------------------------------------


def domain(slug: str, state: str = "ready", **kw) -> DomainView:
    kw.setdefault("last_seen_at", NOW - timedelta(seconds=1))
    kw.setdefault("supervisor_url", f"http://{slug}:8701")
    kw.setdefault("models", (ModelView("qwen", f"http://{slug}:9000", f"{slug}-s", 0, "x"),))
    return DomainView(id=f"id-{slug}", slug=slug, state=state, **kw)


def fleet(*domains: DomainView, active: str = "id-alpha") -> FleetView:
    return FleetView("f", "prod", active, 3, Policy(auto_failover=True), domains)


STALE = NOW - timedelta(minutes=5)
SERVING_JUST_NOW = ModelView(
    "qwen", "http://beta:9000", "beta-s", 0, "serving", serving_seen_at=NOW - timedelta(seconds=1)
)


@pytest.mark.parametrize(
    ("target", "kind", "leads"),
    [
        (domain("gamma"), "promote", True),
        (domain("gamma", "degraded"), "promote", True),
        (domain("gamma", "failed"), "promote", False),
        (domain("gamma", supervisor_url=None), "promote", False),
        (domain("gamma", models=()), "promote", False),
        (domain("gamma", last_seen_at=STALE), "promote", False),
        (domain("gamma"), "demote", False),
        (domain("gamma"), "drill", False),
    ],
)
def test_an_uncommitted_operation_leads_to_serving_when_its_target_can_serve(target, kind, leads):
    f = fleet(domain("alpha", "failed"), target)
    op = InFlight(kind=kind, target_id=target.id, routing_committed=False)
    assert leads_to_serving(f, op, NOW) is leads


@pytest.mark.parametrize(
    ("routed", "leads"),
    [
        (domain("beta"), True),
        (domain("beta", "degraded"), True),  # degraded is not lost (escalation decides)
        (domain("beta", "failed"), False),
        (domain("beta", last_seen_at=STALE), False),
        # Its supervisor is gone but its model servers were just seen serving: not lost.
        (domain("beta", last_seen_at=STALE, models=(SERVING_JUST_NOW,)), True),
    ],
)
def test_a_committed_promotion_leads_to_serving_while_the_domain_it_routed_to_is_not_lost(
    routed, leads
):
    f = fleet(domain("alpha"), routed, active="id-beta")
    op = InFlight(
        kind="promote", target_id="id-beta", routing_committed=True, current_step="demote_old_sleep"
    )
    assert leads_to_serving(f, op, NOW) is leads
    # The same test as failover detection's own: one definition of "lost".
    assert leads is (lost_reason(routed, f.policy, NOW) is None)


def test_a_committed_promotion_whose_target_is_not_routed_to_leads_nowhere():
    f = fleet(domain("alpha"), domain("beta"), active="id-alpha")
    op = InFlight(kind="promote", target_id="id-beta", routing_committed=True)
    assert leads_to_serving(f, op, NOW) is False


def test_an_operation_on_a_domain_gone_from_the_fleet_leads_nowhere():
    for committed in (False, True):
        op = InFlight(kind="promote", target_id="id-gone", routing_committed=committed)
        assert leads_to_serving(fleet(domain("alpha")), op, NOW) is False


# -- whole scenarios: detection, the rule, and how it ends -------------------------------------


def decide(f: FleetView, op: InFlight) -> tuple[FailoverDecision | None, bool, Ending]:
    decision = detect_failover(f, NOW)
    preempt = should_preempt(decision, op, leads_to_serving=leads_to_serving(f, op, NOW))
    return decision, preempt, ending(op)


def test_a_demote_of_the_only_standby_is_preempted_when_the_active_fails():
    f = fleet(domain("alpha", "failed"), domain("beta"))
    op = InFlight(kind="demote", target_id="id-beta", routing_committed=False)
    assert decide(f, op) == (FailoverDecision("id-beta", "active_failed"), True, Ending.CANCEL)


def test_a_committed_promotion_whose_new_active_is_lost_skips_its_steps_on_the_old_active():
    # alpha -> beta switched; alpha's sleep hangs; beta crashed: alpha is the way back.
    f = fleet(domain("alpha"), domain("beta", "failed"), active="id-beta")
    op = InFlight(
        kind="promote", target_id="id-beta", routing_committed=True, current_step="demote_old_sleep"
    )
    decision, preempt, how = decide(f, op)
    assert decision == FailoverDecision("id-alpha", "active_failed")
    assert preempt and how is Ending.SKIP_REST
    assert steps_left(op) == ("demote_old_sleep", "demote_old_train")


def test_a_committed_promotion_whose_new_active_goes_stale_is_preempted_too():
    f = fleet(domain("alpha"), domain("beta", last_seen_at=STALE), active="id-beta")
    op = InFlight(
        kind="promote", target_id="id-beta", routing_committed=True, current_step="demote_old_train"
    )
    decision, preempt, how = decide(f, op)
    assert decision == FailoverDecision("id-alpha", "active_stale")
    assert preempt and how is Ending.SKIP_REST


def test_a_committed_promotion_whose_new_active_is_healthy_is_left_alone():
    f = fleet(domain("alpha", "degraded"), domain("beta"), active="id-beta")
    op = InFlight(
        kind="promote", target_id="id-beta", routing_committed=True, current_step="demote_old_sleep"
    )
    assert decide(f, op)[:2] == (None, False)


def test_a_committed_promotion_with_nobody_to_fail_over_to_is_left_alone():
    f = fleet(domain("alpha", supervisor_url=None), domain("beta", "failed"), active="id-beta")
    op = InFlight(
        kind="promote", target_id="id-beta", routing_committed=True, current_step="demote_old_sleep"
    )
    decision, preempt, _ = decide(f, op)
    assert decision == FailoverDecision(None, "no_viable_standby") and not preempt


def round_trip(step: str) -> InFlight:
    return InFlight(
        kind="drill",
        target_id="id-beta",  # the drilled standby
        routing_committed=False,  # a drill never commits, whatever it moved
        current_step=step,
        drill_mode=DrillMode.ROUND_TRIP,
    )


@pytest.mark.parametrize(
    "step", ["demote_old_sleep", "demote_old_train", "back_stop_training", "back_probe"]
)
def test_a_round_trip_drill_on_its_lost_standby_is_cancelled_and_the_failover_goes_back(step):
    # After the first switch routing is on the drilled standby (beta), and beta is lost.
    f = fleet(domain("alpha"), domain("beta", "failed"), active="id-beta")
    decision, preempt, how = decide(f, round_trip(step))
    assert decision == FailoverDecision("id-alpha", "active_failed")
    assert preempt and how is Ending.CANCEL


@pytest.mark.parametrize("step", ["back_demote_old_sleep", "back_demote_old_train"])
def test_a_round_trip_drill_after_its_second_switch_is_cancelled_not_passed(step):
    # Routing is back on the original (alpha), which is lost; the standby is the way out.
    f = fleet(domain("alpha", "failed"), domain("beta"), active="id-alpha")
    decision, preempt, how = decide(f, round_trip(step))
    assert decision == FailoverDecision("id-beta", "active_failed")
    assert preempt and how is Ending.CANCEL


def test_a_round_trip_drill_whose_routed_standby_is_healthy_is_left_alone():
    f = fleet(domain("alpha"), domain("beta"), active="id-beta")
    assert decide(f, round_trip("demote_old_sleep"))[:2] == (None, False)
