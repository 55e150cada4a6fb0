"""Failover detection, standby viability and ranking, and degraded escalation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleets.core.failover import (
    FailoverDecision,
    data_path_serving,
    detect_failover,
    escalation_held,
    is_stale,
    is_viable_standby,
    rank_standbys,
    should_escalate,
    standby_to_restore,
)
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView, SlotView

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
FRESH = NOW - timedelta(seconds=1)
STALE = NOW - timedelta(seconds=120)
PAST_GRACE = NOW - timedelta(milliseconds=60_001)
WITHIN_GRACE = NOW - timedelta(seconds=59)
AUTO = Policy(auto_failover=True)


def domain(slug: str, state: str = "ready", **kw) -> DomainView:
    kw.setdefault("last_seen_at", FRESH)
    kw.setdefault("supervisor_url", f"http://{slug}:8701")
    kw.setdefault(
        "models", (ModelView("qwen", f"http://{slug}:9000", f"{slug}-s0", 0, "sleeping"),)
    )
    return DomainView(id=f"id-{slug}", slug=slug, state=state, **kw)


def fleet(
    *domains: DomainView, policy: Policy = AUTO, active: str | None = "id-alpha"
) -> FleetView:
    return FleetView("f1", "prod", active, 3, policy, domains)


# --- detect_failover ---------------------------------------------------------------------------


def test_auto_failover_off_never_fails_over_even_with_a_failed_active():
    f = fleet(domain("alpha", "failed"), domain("beta"), policy=Policy())
    assert detect_failover(f, NOW) is None


def test_stale_active_heartbeat_promotes_the_standby():
    f = fleet(domain("alpha", last_seen_at=STALE), domain("beta"))
    assert detect_failover(f, NOW) == FailoverDecision("id-beta", "active_stale")


def test_failed_active_promotes_the_standby():
    f = fleet(domain("alpha", "failed"), domain("beta"))
    assert detect_failover(f, NOW) == FailoverDecision("id-beta", "active_failed")


def test_failed_wins_over_stale_as_the_reason():
    f = fleet(domain("alpha", "failed", last_seen_at=STALE), domain("beta"))
    assert detect_failover(f, NOW).reason == "active_failed"


def test_fresh_healthy_active_does_not_trigger_failover():
    assert detect_failover(fleet(domain("alpha"), domain("beta")), NOW) is None


def test_degraded_but_fresh_active_does_not_trigger_failover():
    assert detect_failover(fleet(domain("alpha", "degraded"), domain("beta")), NOW) is None


def test_never_seen_active_does_not_trigger_failover():
    f = fleet(domain("alpha", last_seen_at=None), domain("beta"))
    assert detect_failover(f, NOW) is None


def test_heartbeat_exactly_at_the_threshold_is_not_stale():
    edge = NOW - timedelta(milliseconds=AUTO.heartbeat_stale_ms)
    assert detect_failover(fleet(domain("alpha", last_seen_at=edge), domain("beta")), NOW) is None
    assert not is_stale(domain("alpha", last_seen_at=edge), AUTO, NOW)
    assert is_stale(domain("alpha", last_seen_at=edge - timedelta(milliseconds=1)), AUTO, NOW)


def test_no_pointer_means_no_failover():
    f = fleet(domain("alpha", "failed"), domain("beta"), active=None)
    assert detect_failover(f, NOW) is None


def test_pointer_to_an_unknown_domain_means_no_failover():
    f = fleet(domain("beta"), active="id-ghost")
    assert detect_failover(f, NOW) is None


def test_no_standby_at_all_reports_no_viable_standby():
    f = fleet(domain("alpha", "failed"))
    assert detect_failover(f, NOW) == FailoverDecision(None, "no_viable_standby")


def test_unpromotable_standby_reports_no_viable_standby():
    f = fleet(domain("alpha", "failed"), domain("beta", "provisioning"))
    assert detect_failover(f, NOW) == FailoverDecision(None, "no_viable_standby")


def test_viable_standby_beats_a_better_ranked_dud():
    # aaa ranks first (priority 0) but has a failed inference slot; bbb is viable.
    dud = domain("aaa", slots=(SlotView("s", 0, "inference", "failed"),))
    f = fleet(domain("alpha", "failed"), dud, domain("bbb", priority=5))
    assert detect_failover(f, NOW).target_id == "id-bbb"


def test_fallback_picks_a_degraded_standby_when_none_is_viable():
    f = fleet(domain("alpha", "failed"), domain("beta", "degraded"))
    assert detect_failover(f, NOW) == FailoverDecision("id-beta", "active_failed")


def test_fallback_picks_a_stale_ready_standby_when_none_is_viable():
    f = fleet(domain("alpha", "failed"), domain("beta", last_seen_at=STALE))
    assert detect_failover(f, NOW).target_id == "id-beta"


def test_fallback_never_picks_a_standby_without_supervisor_or_bindings():
    headless = domain("beta", supervisor_url=None)
    unbound = domain("gamma", models=())
    f = fleet(domain("alpha", "failed"), headless, unbound)
    assert detect_failover(f, NOW) == FailoverDecision(None, "no_viable_standby")


def test_ready_standby_is_preferred_over_a_degraded_one():
    f = fleet(domain("alpha", "failed"), domain("beta", "degraded"), domain("gamma"))
    assert detect_failover(f, NOW).target_id == "id-gamma"


def test_lower_priority_number_is_preferred():
    f = fleet(domain("alpha", "failed"), domain("beta", priority=2), domain("gamma", priority=1))
    assert detect_failover(f, NOW).target_id == "id-gamma"


def test_freshest_heartbeat_is_preferred_at_equal_priority():
    older = domain("beta", last_seen_at=NOW - timedelta(seconds=10))
    f = fleet(domain("alpha", "failed"), older, domain("gamma", last_seen_at=FRESH))
    assert detect_failover(f, NOW).target_id == "id-gamma"


# --- ranking and viability ---------------------------------------------------------------------


def test_ranking_orders_state_then_priority_then_freshness_then_slug():
    f = fleet(
        domain("alpha"),
        domain("failed-one", "failed"),
        domain("deg", "degraded", priority=0),
        domain("ready-late", priority=1),
        domain("ready-b", last_seen_at=NOW - timedelta(seconds=5)),
        domain("ready-a", last_seen_at=NOW - timedelta(seconds=5)),
        domain("ready-never", last_seen_at=None),
        domain("ready-fresh"),
        active="id-alpha",
    )
    assert [d.slug for d in rank_standbys(f, NOW)] == [
        "ready-fresh",
        "ready-a",
        "ready-b",
        "ready-never",
        "ready-late",
        "deg",
        "failed-one",
    ]


def test_ranking_without_pointer_includes_every_domain():
    f = fleet(domain("alpha"), domain("beta"), active=None)
    assert {d.slug for d in rank_standbys(f, NOW)} == {"alpha", "beta"}


def test_viable_standby_needs_every_condition():
    assert is_viable_standby(domain("beta"), AUTO, NOW)
    duds = [
        domain("beta", "degraded"),
        domain("beta", "provisioning"),
        domain("beta", supervisor_url=None),
        domain("beta", supervisor_url=""),
        domain("beta", models=()),
        domain("beta", last_seen_at=None),
        domain("beta", last_seen_at=STALE),
        domain("beta", slots=(SlotView("s", 0, "inference", "failed"),)),
    ]
    assert not any(is_viable_standby(d, AUTO, NOW) for d in duds)


def test_failed_training_slot_does_not_spoil_viability():
    standby = domain("beta", slots=(SlotView("t", 0, "training", "failed"),))
    assert is_viable_standby(standby, AUTO, NOW)


# --- should_escalate ---------------------------------------------------------------------------


def test_degraded_active_past_grace_escalates_when_a_viable_standby_exists():
    f = fleet(domain("alpha", "degraded"), domain("beta"))
    assert should_escalate(f, NOW, PAST_GRACE)


def test_degraded_active_within_grace_does_not_escalate():
    f = fleet(domain("alpha", "degraded"), domain("beta"))
    assert not should_escalate(f, NOW, WITHIN_GRACE)
    exactly = NOW - timedelta(milliseconds=AUTO.degraded_grace_ms)
    assert not should_escalate(f, NOW, exactly)


def test_escalation_needs_auto_failover():
    f = fleet(domain("alpha", "degraded"), domain("beta"), policy=Policy())
    assert not should_escalate(f, NOW, PAST_GRACE)


def test_escalation_needs_a_viable_standby():
    for standby in (
        domain("beta", "provisioning"),
        domain("beta", "degraded"),
        domain("beta", last_seen_at=STALE),
        domain("beta", last_seen_at=None),
        domain("beta", supervisor_url=None),
        domain("beta", models=()),
    ):
        assert not should_escalate(fleet(domain("alpha", "degraded"), standby), NOW, PAST_GRACE)


def test_a_degraded_standby_is_never_escalated():
    f = fleet(domain("alpha"), domain("beta", "degraded"), domain("gamma"))
    assert not should_escalate(f, NOW, PAST_GRACE)


def test_escalation_needs_a_known_degraded_since_and_a_pointer():
    f = fleet(domain("alpha", "degraded"), domain("beta"))
    assert not should_escalate(f, NOW, None)
    assert not should_escalate(fleet(domain("beta"), active=None), NOW, PAST_GRACE)


def test_escalation_honours_a_custom_grace():
    f = fleet(
        domain("alpha", "degraded"), domain("beta"), policy=Policy(True, degraded_grace_ms=10)
    )
    assert should_escalate(f, NOW, NOW - timedelta(milliseconds=11))


# --- standby_to_restore ------------------------------------------------------------------------


def awake(slug: str, state: str = "ready", slot_state: str = "failed", **kw) -> DomainView:
    return domain(slug, state, slots=(SlotView(f"{slug}-s0", 0, "inference", slot_state),), **kw)


def test_a_ready_standby_with_awake_models_is_restored():
    f = fleet(domain("alpha"), awake("beta"))
    assert standby_to_restore(f, NOW).id == "id-beta"


def test_a_standby_already_asleep_is_left_alone():
    f = fleet(domain("alpha"), awake("beta", slot_state="sleeping"))
    assert standby_to_restore(f, NOW) is None


def test_the_active_is_never_restored_even_when_it_reads_awake():
    f = fleet(awake("alpha", slot_state="serving"), domain("beta"))
    assert standby_to_restore(f, NOW) is None


def test_a_standby_not_yet_ready_or_stale_waits():
    assert standby_to_restore(fleet(domain("alpha"), awake("beta", "degraded")), NOW) is None
    assert (
        standby_to_restore(fleet(domain("alpha"), awake("beta", last_seen_at=STALE)), NOW) is None
    )


def test_restore_backs_off_after_a_recent_failed_demotion():
    f = fleet(domain("alpha"), awake("beta"))
    assert standby_to_restore(f, NOW, {"id-beta": NOW - timedelta(seconds=10)}) is None
    assert standby_to_restore(f, NOW, {"id-beta": NOW - timedelta(minutes=6)}).id == "id-beta"


def test_a_standby_being_provisioned_is_left_to_the_provisioning_pass():
    f = fleet(domain("alpha"), awake("beta"))
    assert standby_to_restore(f, NOW, being_provisioned=frozenset({"id-beta"})) is None
    assert standby_to_restore(f, NOW, being_provisioned=frozenset({"id-other"})).id == "id-beta"


def test_restore_is_off_when_the_policy_says_so():
    f = fleet(domain("alpha"), awake("beta"), policy=Policy(restore_standby_on_return=False))
    assert standby_to_restore(f, NOW) is None


# --- the data path decides about a degraded active ---------------------------------------------


def serving(slug: str, seen: datetime | None = FRESH, health: str = "up") -> ModelView:
    return ModelView("qwen", f"http://{slug}:9000", f"{slug}-s0", 0, "serving", health, seen)


def test_an_active_whose_model_servers_serve_is_never_escalated():
    # Its supervisor is dead, partitioned away or too slow to answer: degraded, but every model
    # server was seen serving within the stale window.
    alpha = domain("alpha", "degraded", last_seen_at=STALE, models=(serving("alpha"),))
    f = fleet(alpha, domain("beta"))
    assert not should_escalate(f, NOW, PAST_GRACE)
    assert escalation_held(f, NOW)
    assert data_path_serving(alpha, AUTO, NOW)


def test_escalation_follows_once_the_data_path_fails_too():
    down = domain("alpha", "degraded", models=(serving("alpha", health="down"),))
    unseen = domain("alpha", "degraded", models=(serving("alpha", seen=STALE),))
    never = domain("alpha", "degraded", models=(serving("alpha", seen=None),))
    unknown = domain("alpha", "degraded", models=(serving("alpha", health="unknown"),))
    for alpha in (down, unseen, never, unknown):
        f = fleet(alpha, domain("beta"))
        assert should_escalate(f, NOW, PAST_GRACE), alpha.models
        assert not escalation_held(f, NOW)


def test_one_model_server_down_is_the_data_path_failing():
    alpha = domain(
        "alpha",
        "degraded",
        models=(serving("alpha"), ModelView("llama", "http://a:9001", "s0", 0, "failed", "down")),
    )
    assert not data_path_serving(alpha, AUTO, NOW)
    assert should_escalate(fleet(alpha, domain("beta")), NOW, PAST_GRACE)


def test_only_a_degraded_active_is_held_by_its_data_path():
    ready = fleet(domain("alpha", models=(serving("alpha"),)), domain("beta"))
    assert not escalation_held(ready, NOW)
    failed = fleet(domain("alpha", "failed", models=(serving("alpha"),)), domain("beta"))
    assert not escalation_held(failed, NOW)
    assert not data_path_serving(domain("alpha", models=()), AUTO, NOW)
