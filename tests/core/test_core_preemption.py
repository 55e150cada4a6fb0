"""Pre-emption: every combination of failover outcome and in-flight operation, as a table."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from fleets.core.failover import FailoverDecision, detect_failover
from fleets.core.policy import Policy
from fleets.core.preemption import InFlight, leads_to_serving, should_preempt
from fleets.core.read_model import DomainView, FleetView, ModelView

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
FAILOVERS = {
    "active fine": None,
    "lost, nobody to promote": FailoverDecision(None, "no_viable_standby"),
    "lost, all backing off": FailoverDecision(None, "failover_backoff"),
    "lost, standby found": FailoverDecision("id-beta", "active_failed"),
}


def expected(failover: str, kind: str, committed: bool, serving: bool) -> bool:
    """The rule, spelt out: only a lost active with someone to promote pre-empts, and then
    everything except a promotion that will (or did) put a serving domain in front."""
    if failover != "lost, standby found":
        return False
    if kind == "demote":
        return True
    return not (committed or serving)


CASES = list(itertools.product(FAILOVERS, ["promote", "demote"], [False, True], [False, True]))


@pytest.mark.parametrize(("failover", "kind", "committed", "serving"), CASES)
def test_preemption_table(failover, kind, committed, serving):
    op = InFlight(kind=kind, target_id="id-gamma", routing_committed=committed)
    got = should_preempt(FAILOVERS[failover], op, leads_to_serving=serving)
    assert got is expected(failover, kind, committed, serving)


def test_the_table_is_exhaustive():
    assert len(CASES) == 4 * 2 * 2 * 2


def domain(slug: str, state: str = "ready", **kw) -> DomainView:
    kw.setdefault("last_seen_at", NOW - timedelta(seconds=1))
    kw.setdefault("supervisor_url", f"http://{slug}:8701")
    kw.setdefault("models", (ModelView("qwen", f"http://{slug}:9000", f"{slug}-s", 0, "x"),))
    return DomainView(id=f"id-{slug}", slug=slug, state=state, **kw)


def fleet(*domains: DomainView) -> FleetView:
    return FleetView("f", "prod", "id-alpha", 3, Policy(auto_failover=True), domains)


@pytest.mark.parametrize(
    ("target", "kind", "committed", "leads"),
    [
        (domain("gamma"), "promote", False, True),
        (domain("gamma", "degraded"), "promote", False, True),
        (domain("gamma", "failed"), "promote", False, False),
        (domain("gamma", supervisor_url=None), "promote", False, False),
        (domain("gamma", models=()), "promote", False, False),
        (domain("gamma", last_seen_at=NOW - timedelta(minutes=5)), "promote", False, False),
        (domain("gamma", "failed"), "promote", True, True),  # routing already moved there
        (domain("gamma"), "demote", False, False),
    ],
)
def test_leads_to_serving(target, kind, committed, leads):
    f = fleet(domain("alpha", "failed"), target)
    op = InFlight(kind=kind, target_id=target.id, routing_committed=committed)
    assert leads_to_serving(f, op, NOW) is leads


def test_an_operation_on_a_domain_gone_from_the_fleet_leads_nowhere():
    op = InFlight(kind="promote", target_id="id-gone", routing_committed=False)
    assert leads_to_serving(fleet(domain("alpha")), op, NOW) is False


def test_a_demote_of_the_only_standby_is_preempted_when_the_active_fails():
    f = fleet(domain("alpha", "failed"), domain("beta"))
    decision = detect_failover(f, NOW)
    op = InFlight(kind="demote", target_id="id-beta", routing_committed=False)
    assert decision == FailoverDecision("id-beta", "active_failed")
    assert should_preempt(decision, op, leads_to_serving=leads_to_serving(f, op, NOW))
