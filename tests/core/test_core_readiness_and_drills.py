"""The readiness verdict and the drill rules: pure, on hand-built views."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, time, timedelta

from fleets.core.drills import DrillSchedule, decide_drill, drill_due, in_window
from fleets.core.drills import schedule_problems as problems
from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView, SlotView
from fleets.core.readiness import (
    DrillFacts,
    GpuFacts,
    ReadinessVerdict,
    StandbyFacts,
    TrainerFacts,
    failover_readiness,
)
from fleets.core.states import DRILL_STEPS, PROMOTE_STEPS, ROUND_TRIP_DRILL_STEPS, steps_for

READY, AT_RISK, NOT_READY = (
    ReadinessVerdict.READY,
    ReadinessVerdict.AT_RISK,
    ReadinessVerdict.NOT_READY,
)
NOW = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
FRESH = NOW - timedelta(seconds=1)


def domain(slug: str, state: str = "ready", slot_state: str = "sleeping", **kw) -> DomainView:
    kw.setdefault("last_seen_at", FRESH)
    kw.setdefault("supervisor_url", f"http://{slug}:8701")
    slots = (
        SlotView(f"{slug}-s0", 0, "inference", slot_state),
        SlotView(f"{slug}-t0", 0, "training", "training"),
    )
    models = (ModelView("qwen", f"http://{slug}:9000", f"{slug}-s0", 0, slot_state),)
    return DomainView(id=f"id-{slug}", slug=slug, state=state, slots=slots, models=models, **kw)


def fleet(*domains: DomainView) -> FleetView:
    return FleetView("f1", "prod", "id-east", 3, Policy(), domains)


GOOD = StandbyFacts(
    gpus=(GpuFacts(0, used_mib=40_000, total_mib=81_920),),
    gpus_read_at=NOW - timedelta(seconds=5),
    wake_mib={0: 8_192},
    trainers=(TrainerFacts(0, "running", NOW - timedelta(minutes=2)),),
    baselines_at=NOW - timedelta(days=2),
)
PASSED = DrillFacts(NOW - timedelta(hours=3), passed=True)


def verdict(*domains, facts=GOOD, drill=PASSED):
    return failover_readiness(fleet(*domains), {"id-west": facts}, drill, NOW)


def reason(readiness, check):
    return next(r for r in readiness.reasons if r.check == check)


def test_everything_proven_and_fresh_is_ready_with_each_reason_aged():
    r = verdict(domain("east", slot_state="serving"), domain("west"))
    assert r.verdict == READY and r.standby == "west"
    body = r.to_json()
    assert [x["check"] for x in body["reasons"]] == [
        "standby", "modelsAsleep", "baselines", "wakeMemory", "trainer", "drill"
    ]  # fmt: skip
    # Every reason carries the time of the fact it rests on, and its age.
    ages = {x["check"]: x["ageMs"] for x in body["reasons"]}
    assert ages == {
        "standby": 1000,  # the standby's last heartbeat
        "modelsAsleep": 1000,  # slot states are mirrored from that heartbeat
        "baselines": 2 * 86_400_000,  # the oldest baseline the standby is judged against
        "wakeMemory": 5000,  # the GPU memory reading
        "trainer": 120_000,  # the oldest checkpoint
        "drill": 3 * 3_600_000,  # the last drill's end
    }
    assert all(x["at"] is not None for x in body["reasons"])


def test_a_reason_that_fails_or_is_unknown_still_says_how_old_its_fact_is():
    seen = NOW - timedelta(seconds=4)
    east = domain("east", slot_state="serving")
    west = domain("west", slot_state="serving", last_seen_at=seen)
    bare = StandbyFacts(missing_baselines=("qwen on engine 0.12.0",))
    r = verdict(east, west, facts=bare, drill=DrillFacts(NOW, False, "probe_mismatch: qwen"))
    body = {x["check"]: x for x in r.to_json()["reasons"]}
    assert body["modelsAsleep"]["ok"] is False and body["modelsAsleep"]["ageMs"] == 4000
    assert body["baselines"]["ok"] is False and body["baselines"]["ageMs"] == 4000
    assert body["baselines"]["message"] == "no golden baseline yet for qwen on engine 0.12.0"
    # No plan and no reading: unknown, as of the heartbeat that brought nothing.
    assert body["wakeMemory"]["ok"] is None and body["wakeMemory"]["ageMs"] == 4000
    # No trainer at all: as the heartbeat reported the standby.
    assert body["trainer"] == {**body["trainer"], "ok": True, "ageMs": 4000}
    assert body["drill"]["ageMs"] == 0
    # A trainer that never checkpointed: the heartbeat that reported it.
    idle = StandbyFacts(trainers=(TrainerFacts(0, "idle", None),), baselines_at=None)
    trainer = reason(verdict(east, west, facts=idle), "trainer").to_json(NOW)
    assert trainer["ok"] is False and trainer["ageMs"] == 4000
    # All baselines present but none dated (none needed): the heartbeat's time.
    dated = reason(verdict(east, west, facts=idle), "baselines").to_json(NOW)
    assert dated["ok"] is True and dated["ageMs"] == 4000


def test_only_a_fact_never_observed_has_no_age():
    never = domain("west", last_seen_at=None)
    r = verdict(domain("east", slot_state="serving"), never, facts=StandbyFacts(), drill=None)
    ages = {x["check"]: x["ageMs"] for x in r.to_json()["reasons"]}
    assert ages["standby"] is None and ages["drill"] is None  # never heard, never drilled
    assert reason(r, "standby").message == "west has never answered a heartbeat"


def test_a_stale_standby_or_its_wake_memory_taken_means_not_ready():
    stale = domain("west", last_seen_at=NOW - timedelta(minutes=5))
    r = verdict(domain("east", slot_state="serving"), stale)
    assert r.verdict == NOT_READY and "heartbeat stale" in reason(r, "standby").message
    leaked = StandbyFacts(
        gpus=(GpuFacts(0, used_mib=78_000, total_mib=81_920),),
        gpus_read_at=NOW,
        wake_mib={0: 8_192},
        trainers=GOOD.trainers,
    )
    r = verdict(domain("east", slot_state="serving"), domain("west"), facts=leaked)
    assert r.verdict == NOT_READY
    assert reason(r, "wakeMemory").message == "GPU 0 has 3920 MiB free, the wake needs 8192"


def test_unproven_things_put_the_fleet_at_risk_and_say_which():
    east = domain("east", slot_state="serving")
    no_drill = verdict(east, domain("west"), drill=None)
    assert no_drill.verdict == AT_RISK and reason(no_drill, "drill").ok is None
    failed = verdict(east, domain("west"), drill=DrillFacts(NOW, False, "probe_mismatch: qwen"))
    assert failed.verdict == AT_RISK and "probe_mismatch" in reason(failed, "drill").message
    awake = verdict(east, domain("west", slot_state="serving"))
    assert awake.verdict == AT_RISK and reason(awake, "modelsAsleep").ok is False
    stalled = StandbyFacts(
        gpus=GOOD.gpus,
        gpus_read_at=NOW,
        wake_mib=GOOD.wake_mib,
        trainers=(TrainerFacts(0, "running", NOW - timedelta(hours=2)),),
        missing_baselines=("qwen (adapter sql)",),
    )
    r = verdict(east, domain("west"), facts=stalled)
    assert r.verdict == AT_RISK
    assert "last checkpoint 120 min ago" in reason(r, "trainer").message
    assert reason(r, "baselines").message == "no golden baseline yet for qwen (adapter sql)"
    unplanned = StandbyFacts(trainers=GOOD.trainers)
    assert reason(verdict(east, domain("west"), facts=unplanned), "wakeMemory").ok is None


def test_a_fleet_without_a_standby_is_not_ready():
    r = verdict(domain("east", slot_state="serving"))
    assert r.verdict == NOT_READY and r.standby is None


# -- drills ------------------------------------------------------------------------------------


def test_a_drill_is_due_every_interval_inside_its_window_only():
    schedule = DrillSchedule(60, time(2, 0), time(4, 0))
    assert drill_due(schedule, None, NOW)
    assert not drill_due(schedule, NOW - timedelta(minutes=59), NOW)
    assert drill_due(schedule, NOW - timedelta(minutes=60), NOW)
    assert not drill_due(schedule, None, NOW.replace(hour=4))  # the end is exclusive
    assert not drill_due(DrillSchedule(None), None, NOW)  # no interval: only by hand


def test_a_window_may_wrap_midnight():
    wraps = DrillSchedule(60, time(23, 0), time(1, 0))
    assert in_window(wraps, NOW.replace(hour=23, minute=30))
    assert in_window(wraps, NOW.replace(hour=0, minute=30))
    assert not in_window(wraps, NOW)


def test_a_bad_schedule_is_refused_with_reasons():
    assert problems(DrillSchedule(0)) == ["drill interval must be 1 to 129600 minutes"]
    assert problems(DrillSchedule(5, time(1, 0), None))[0].startswith("give both ends")
    assert problems(DrillSchedule(5, time(1, 0), time(1, 0))) == [
        "the drill window is empty (start equals end)"
    ]
    assert problems(DrillSchedule(5, time(1, 0), time(2, 0))) == []


def test_a_drill_picks_the_failover_standby_and_refuses_troubled_fleets():
    east = domain("east", slot_state="serving")
    ok = decide_drill(fleet(east, domain("west")), None, NOW)
    assert ok.outcome == "proceed" and ok.target is not None and ok.target.slug == "west"
    degraded = decide_drill(fleet(east, domain("west", state="degraded")), None, NOW)
    assert degraded.outcome == "reject" and "west is degraded" in degraded.message
    active = decide_drill(fleet(east, domain("west")), "east", NOW)
    assert active.outcome == "reject" and "is the active domain" in active.message
    stale = domain("west", last_seen_at=NOW - timedelta(minutes=5))
    assert decide_drill(fleet(east, stale), None, NOW).outcome == "reject"


def test_a_round_trip_drill_needs_automatic_failover_on():
    east = domain("east", slot_state="serving")
    off = decide_drill(fleet(east, domain("west")), None, NOW, "round_trip")
    assert off.outcome == "reject" and "autoFailover is off" in off.message
    on = replace(fleet(east, domain("west")), policy=Policy(auto_failover=True))
    assert decide_drill(on, None, NOW, "round_trip").outcome == "proceed"
    # A check drill never needs it: routing does not move.
    assert decide_drill(fleet(east, domain("west")), None, NOW, "check").outcome == "proceed"


def test_a_round_trip_runs_the_promotion_there_and_back_under_the_same_budgets():
    assert ROUND_TRIP_DRILL_STEPS[:7] == PROMOTE_STEPS
    assert ROUND_TRIP_DRILL_STEPS[7:] == tuple(f"back_{s}" for s in PROMOTE_STEPS)
    assert steps_for("drill", "round_trip") == ROUND_TRIP_DRILL_STEPS
    assert steps_for("drill", "check") == steps_for("drill") == DRILL_STEPS
    policy = Policy()
    for step in PROMOTE_STEPS:
        assert policy.step_timeout_ms(f"back_{step}") == policy.step_timeout_ms(step)


# -- an original supervisor: proofs that never come, and an operator who accepts them ----------

ORIGINAL = StandbyFacts(
    gpus=GOOD.gpus,
    gpus_read_at=GOOD.gpus_read_at,
    wake_mib=GOOD.wake_mib,
    trainers=(TrainerFacts(0, "running", None),),
    missing_baselines=("qwen",),
    golden_probes=False,
    checkpoint_times=False,
)


def accepting(*checks: str) -> Policy:
    return Policy.resolve({"readiness": {"acceptMissing": list(checks)}})


def test_with_an_original_supervisor_the_reasons_say_why_the_proof_never_comes():
    east = domain("east", slot_state="serving")
    r = verdict(east, domain("west"), facts=ORIGINAL)
    assert r.verdict == AT_RISK
    baselines, trainer = reason(r, "baselines"), reason(r, "trainer")
    assert "runs no golden probes" in baselines.message
    assert "reports no checkpoint times" in trainer.message
    for why in (baselines, trainer):
        assert why.message.endswith("accept it with readiness.acceptMissing")
        assert why.accepted is False


def test_an_operator_accepts_the_missing_proofs_and_the_verdict_reads_ready():
    east, west = domain("east", slot_state="serving"), domain("west")
    view = replace(fleet(east, west), policy=accepting("baselines", "trainer"))
    r = failover_readiness(view, {"id-west": ORIGINAL}, PASSED, NOW)
    assert r.verdict == READY
    body = {x["check"]: x for x in r.to_json()["reasons"]}
    # The facts stay as they are; only the verdict stops counting them as a risk.
    assert body["baselines"] == {**body["baselines"], "ok": False, "accepted": True}
    assert body["trainer"] == {**body["trainer"], "ok": False, "accepted": True}
    assert body["drill"]["accepted"] is False  # proven: nothing to accept
    # Accepting one of two missing proofs leaves the fleet at risk.
    partial = replace(view, policy=accepting("baselines"))
    assert failover_readiness(partial, {"id-west": ORIGINAL}, PASSED, NOW).verdict == AT_RISK


def test_an_accepted_check_never_hides_a_failover_that_would_fail():
    east, west = domain("east", slot_state="serving"), domain("west")
    leaked = replace(GOOD, gpus=(GpuFacts(0, used_mib=78_000, total_mib=81_920),))
    view = replace(fleet(east, west), policy=accepting("wakeMemory", "drill"))
    r = failover_readiness(view, {"id-west": leaked}, None, NOW)
    assert r.verdict == NOT_READY and reason(r, "wakeMemory").accepted is False
    # An unknown need (no memory plan) and no drill are what may be accepted.
    unplanned = replace(GOOD, wake_mib=None)
    r = failover_readiness(view, {"id-west": unplanned}, None, NOW)
    assert r.verdict == READY
    assert reason(r, "wakeMemory").accepted and reason(r, "drill").accepted
