"""One heartbeat, decided at once: every move of the beat comes out of one pure plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleets.core.beat_plan import BindingRow, GpuAnswer, Heard, SlotRow, beat_plan, gpu_keys
from fleets.core.model_health import Reach, ServerHealth
from fleets.core.report import (
    DomainReport,
    GpuMemory,
    GpuReport,
    ModelReport,
    ReadError,
    SlotReport,
    StatusReport,
    TrainingReport,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(milliseconds=40)
NOTHING_STORED = DomainReport()

SLOTS = [
    SlotRow("s-inf0", "inference", "serving", 0),
    SlotRow("s-inf1", "inference", "serving", 1),
    SlotRow("s-train", "training", "idle", 2),
]
BINDINGS = [
    BindingRow("b-a", "s-inf0", "a", "up", "0.9"),
    BindingRow("b-b", "s-inf1", "b", "up", "0.9"),
]


def status(*, a_asleep: bool, b_asleep: bool, trainer: str = "running") -> StatusReport:
    return StatusReport(
        slots=(
            SlotReport(0, "inference", (ModelReport("a", a_asleep, engine_version="1.0"),)),
            SlotReport(1, "inference", (ModelReport("b", b_asleep, engine_version="0.9"),)),
            SlotReport(2, "training", training=TrainingReport(trainer, (77,))),
        ),
        ready=not (a_asleep or b_asleep),
    )


def plan_for(heard: Heard, *, domain_state: str = "ready", stored=NOTHING_STORED):
    return beat_plan(
        domain_id="d",
        fleet_id="f",
        domain_state=domain_state,
        stored=stored,
        slots=SLOTS,
        bindings=BINDINGS,
        heard=heard,
        is_active=True,
        settle_serving=True,
        now=NOW,
    )


def test_one_plan_holds_every_move_of_the_beat():
    plan = plan_for(Heard(T0, status(a_asleep=True, b_asleep=True)))
    assert [(m.slot_id, m.from_state, m.to_state) for m in plan.slots] == [
        ("s-inf0", "serving", "failed"),
        ("s-inf1", "serving", "failed"),
        ("s-train", "idle", "training"),
    ]
    assert plan.slots[2].pids == [77]
    assert (plan.domain.from_state, plan.domain.to_state) == ("ready", "degraded")
    assert plan.domain.reason == "not every bound model is awake"
    assert [(h.binding_id, h.health, h.source) for h in plan.health] == [
        ("b-a", ServerHealth.DOWN, "supervisor"),
        ("b-b", ServerHealth.DOWN, "supervisor"),
    ]
    assert [(v.binding_id, v.engine_version) for v in plan.versions] == [("b-a", "1.0")]
    assert plan.seen is not None and plan.seen.status == status(a_asleep=True, b_asleep=True)
    assert plan.failed is None and (plan.observed_at, plan.now) == (T0, NOW)


def test_a_healthy_beat_plans_no_move_but_the_record():
    plan = plan_for(Heard(T0, status(a_asleep=False, b_asleep=False, trainer="idle")))
    assert plan.slots == () and plan.domain is None and plan.health == ()
    assert plan.seen is not None


def test_an_unanswered_beat_plans_the_failure_and_no_report():
    error = ReadError("network", "connection refused")
    plan = plan_for(Heard(T0, None, error=error, direct={"a": Reach.REFUSED}))
    assert [(m.slot_id, m.to_state, m.reason) for m in plan.slots] == [
        ("s-inf0", "failed", "supervisor unreachable"),
        ("s-inf1", "failed", "supervisor unreachable"),
    ]  # the trainer is left alone: nothing was said about it
    assert plan.domain.to_state == "degraded" and plan.domain.reason == "heartbeat failed"
    assert [(h.binding_id, h.health, h.source) for h in plan.health] == [
        ("b-a", ServerHealth.DOWN, "direct")
    ]
    assert plan.seen is None and plan.failed == error and plan.gpus_read_at is None


def test_the_gpu_answer_rides_with_the_report_and_dates_the_read():
    asked = T0 - timedelta(milliseconds=300)
    memory = GpuMemory((GpuReport(0, 10.0, 100.0),))
    heard = Heard(T0, status(a_asleep=False, b_asleep=False), gpu=GpuAnswer(asked, memory))
    plan = plan_for(heard)
    assert plan.seen.gpus == memory.gpus and plan.seen.gpus_at == asked
    assert plan.gpus_read_at == asked


def test_gpu_memory_is_carried_over_kept_or_dropped_as_the_answer_says():
    earlier = T0 - timedelta(seconds=5)
    old = DomainReport(gpus=(GpuReport(0, 1.0, 2.0),), gpus_at=earlier)
    assert gpu_keys(old, None) == (old.gpus, earlier, None)
    failed = GpuAnswer(T0, error=ReadError("http", "502", status=502))
    assert gpu_keys(old, failed) == (old.gpus, earlier, ReadError("http", "502", 502, at=T0))
    none_here = GpuAnswer(T0, error=ReadError("http", "501", status=501), unavailable=True)
    assert gpu_keys(old, none_here) == ((), T0, ReadError("http", "501", 501, at=T0))
