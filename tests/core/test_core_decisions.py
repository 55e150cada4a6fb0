"""Promote and demote decisions: no-op, proceed, or an explained invalid_target."""

from __future__ import annotations

from fleets.core.decisions import Decision, decide_demotion, decide_promotion, find_domain
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView

A_ID = "00000000-0000-4000-8000-00000000000a"
B_ID = "00000000-0000-4000-8000-00000000000b"


def domain(id_: str, slug: str, state: str = "ready", *, bound: bool = True) -> DomainView:
    models = (
        (ModelView("qwen", f"http://{slug}:9000", f"{slug}-s0", 0, "sleeping"),) if bound else ()
    )
    return DomainView(
        id=id_, slug=slug, state=state, supervisor_url=f"http://{slug}", models=models
    )


def fleet(*domains: DomainView, active: str | None = A_ID) -> FleetView:
    if not domains:
        domains = (domain(A_ID, "alpha"), domain(B_ID, "beta"))
    return FleetView("f1", "prod", active, 7, Policy(), tuple(domains))


def test_promoting_the_active_domain_is_a_noop():
    decision = decide_promotion(fleet(), A_ID)
    assert decision.outcome == "noop"
    assert decision.code == "already_active"
    assert "alpha" in decision.message and "7" in decision.message


def test_promoting_the_active_is_a_noop_even_when_it_is_failed():
    decision = decide_promotion(fleet(domain(A_ID, "alpha", "failed"), domain(B_ID, "beta")), A_ID)
    assert decision.outcome == "noop"


def test_promoting_a_ready_standby_with_bindings_proceeds():
    f = fleet()
    assert decide_promotion(f, B_ID) == Decision("proceed", target=f.domain(B_ID))


def test_promoting_a_degraded_standby_proceeds():
    f = fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", "degraded"))
    assert decide_promotion(f, B_ID).outcome == "proceed"


def test_promoting_a_domain_outside_the_fleet_is_invalid_target():
    decision = decide_promotion(fleet(), "00000000-0000-4000-8000-0000000000ff")
    assert (decision.outcome, decision.code) == ("reject", "invalid_target")
    assert "not in fleet 'prod'" in decision.message


def test_promoting_a_domain_in_an_unpromotable_state_is_refused_for_each_state():
    for state in ("provisioning", "failed", "stopping", "stopped"):
        decision = decide_promotion(fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", state)), B_ID)
        assert (decision.outcome, decision.code) == ("reject", "invalid_target")
        assert f"'beta' is {state}" in decision.message


def test_promoting_a_domain_without_bindings_is_refused():
    decision = decide_promotion(
        fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", bound=False)), B_ID
    )
    assert (decision.outcome, decision.code) == ("reject", "invalid_target")
    assert "'beta' has no model bindings" in decision.message


def test_state_is_reported_before_missing_bindings():
    f = fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", "failed", bound=False))
    assert "is failed" in decide_promotion(f, B_ID).message


def test_first_promotion_of_a_fleet_without_pointer_proceeds():
    assert decide_promotion(fleet(active=None), A_ID).outcome == "proceed"


def test_promotion_accepts_a_slug_or_an_upper_case_id():
    assert decide_promotion(fleet(), "beta").outcome == "proceed"
    assert decide_promotion(fleet(), B_ID.upper()).outcome == "proceed"
    assert decide_promotion(fleet(), "alpha").outcome == "noop"


def test_id_wins_over_a_slug_that_looks_like_another_id():
    tricky = domain(B_ID, A_ID)  # a slug equal to alpha's id
    f = fleet(domain(A_ID, "alpha"), tricky)
    assert find_domain(f, A_ID).slug == "alpha"


def test_the_active_domain_is_never_demoted():
    decision = decide_demotion(fleet(), A_ID)
    assert (decision.outcome, decision.code) == ("reject", "invalid_target")
    assert "'alpha' is the active domain" in decision.message


def test_demoting_a_ready_or_degraded_standby_proceeds():
    f = fleet()
    assert decide_demotion(f, B_ID) == Decision("proceed", target=f.domain(B_ID))
    f = fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", "degraded"))
    assert decide_demotion(f, "beta").outcome == "proceed"


def test_demoting_a_standby_in_another_state_is_refused():
    for state in ("provisioning", "failed", "stopping", "stopped"):
        decision = decide_demotion(fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", state)), B_ID)
        assert (decision.outcome, decision.code) == ("reject", "invalid_target")
        assert f"'beta' is {state}" in decision.message


def test_demoting_a_domain_outside_the_fleet_is_refused():
    decision = decide_demotion(fleet(), "gamma")
    assert (decision.outcome, decision.code) == ("reject", "invalid_target")
    assert "'gamma' is not in fleet 'prod'" in decision.message


def test_demoting_needs_no_bindings():
    f = fleet(domain(A_ID, "alpha"), domain(B_ID, "beta", bound=False))
    assert decide_demotion(f, B_ID).outcome == "proceed"


def test_the_decision_names_the_domain_a_slug_or_any_uuid_spelling_resolved_to():
    f = fleet()
    for ref in ("beta", " BETA ", B_ID.upper(), B_ID.replace("-", ""), "{" + B_ID + "}"):
        assert decide_promotion(f, ref).target == f.domain(B_ID), ref
        assert decide_demotion(f, ref).target == f.domain(B_ID), ref
    assert decide_promotion(f, A_ID).target == f.domain(A_ID)  # the no-op names it too
    assert decide_promotion(f, "gamma").target is None
