"""One heartbeat, one service call: the plan's moves are written with their events, each row
behind its own guard, and the report is stored normalized and read one way by every reader."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleets.base import clock
from fleets.core.beat_plan import (
    BeatPlan,
    BindingRow,
    DomainMove,
    Heard,
    SlotMove,
    SlotRow,
    beat_plan,
    model_posture,
)
from fleets.core.mirror import ModelPosture
from fleets.core.policy import Policy
from fleets.core.report import (
    DomainReport,
    GpuProcess,
    GpuReport,
    ModelReport,
    SlotReport,
    StatusReport,
    TrainingReport,
    read_report,
)
from fleets.dashboard.selectors import fleet_page
from fleets.models import Domain, Event, ModelBinding, Slot
from fleets.reads.readiness import standby_facts
from fleets.services.heartbeats import heartbeat_record

pytestmark = pytest.mark.django_db


def _west(fleet):
    domain = Domain.objects.get(fleet=fleet, slug="west")
    slots = {s.kind: s for s in Slot.objects.filter(domain=domain)}
    return domain, slots


def _plan(domain, slots, observed_at, **extra) -> BeatPlan:
    return BeatPlan(
        domain_id=domain.id,
        fleet_id=domain.fleet_id,
        observed_at=observed_at,
        now=observed_at + timedelta(milliseconds=5),
        slots=(
            SlotMove(slots["inference"].id, "sleeping", "failed", "missing from status: x"),
            SlotMove(slots["training"].id, "idle", "training", "trainer running", [4242]),
        ),
        domain=DomainMove("ready", "degraded", "model state unknown"),
        **extra,
    )


def test_a_beat_with_several_moves_writes_them_and_their_events_in_one_call(seeded_fleet):
    domain, slots = _west(seeded_fleet)
    observed = clock.now()
    seen = DomainReport(status=StatusReport(slots=(), ready=False))

    heartbeat_record(plan=_plan(domain, slots, observed, seen=seen))

    assert Slot.objects.get(pk=slots["inference"].id).state == "failed"
    trainer = Slot.objects.get(pk=slots["training"].id)
    assert (trainer.state, trainer.pids) == ("training", [4242])
    domain.refresh_from_db()
    assert domain.state == "degraded" and domain.last_seen_at == observed
    assert domain.last_report["heartbeat"]["ok"] is True
    kinds = list(Event.objects.filter(domain=domain).order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["slot.inference.failed", "slot.training.training", "domain.degraded"]


def test_a_row_moved_after_the_report_was_taken_loses_and_writes_nothing(seeded_fleet):
    domain, slots = _west(seeded_fleet)
    observed = clock.now()
    # An operation step moved the inference slot after the report was taken: newer news.
    Slot.objects.filter(pk=slots["inference"].id).update(
        state_updated_at=observed + timedelta(seconds=1)
    )
    last_event = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0

    heartbeat_record(plan=_plan(domain, slots, observed))

    assert Slot.objects.get(pk=slots["inference"].id).state == "sleeping"  # the loser
    assert Slot.objects.get(pk=slots["training"].id).state == "training"  # the others move
    kinds = set(Event.objects.filter(id__gt=last_event).values_list("kind", flat=True))
    assert "slot.inference.failed" not in kinds
    assert {"slot.training.training", "domain.degraded"} <= kinds


def _card(fleet, slug: str) -> dict:
    return next(c for c in fleet_page(fleet, now=clock.now())["domains"] if c["slug"] == slug)


def _report() -> StatusReport:
    return StatusReport(
        slots=(
            SlotReport(
                0,
                "inference",
                (
                    ModelReport("llama-small", True, pid=101, fingerprint="sha256:ab"),
                    ModelReport("qwen-small", None, pid=102),
                ),
            ),
            SlotReport(0, "training", training=TrainingReport("running", (200,))),
        ),
        ready=False,
    )


def test_a_report_normalized_once_reads_the_same_in_the_reconciler_readiness_and_dashboard(
    seeded_fleet,
):
    domain, slots = _west(seeded_fleet)
    gpus = (GpuReport(0, 40000.0, 81920.0, processes=(GpuProcess(200, 38000.0),)),)
    stored_before = DomainReport(gpus=gpus, gpus_at=clock.now())
    bindings = [
        BindingRow(b.id, b.slot_id, b.name, b.health, b.engine_version)
        for b in ModelBinding.objects.filter(domain=domain)
    ]
    plan = beat_plan(
        domain_id=domain.id,
        fleet_id=domain.fleet_id,
        domain_state=domain.state,
        stored=stored_before,
        slots=[SlotRow(s.id, s.kind, s.state, s.gpu_index) for s in slots.values()],
        bindings=bindings,
        heard=Heard(clock.now(), _report()),
        is_active=False,
        settle_serving=True,
        now=clock.now(),
    )
    heartbeat_record(plan=plan)
    domain.refresh_from_db()

    # Stored normalized: reading the row gives back the model the beat decided on.
    stored = read_report(domain.last_report)
    assert stored.status == _report() and stored.gpus == gpus
    # The reconciler's next beat reads the same postures from it ...
    assert model_posture(stored.status, "llama-small") == ModelPosture.ASLEEP
    assert model_posture(stored.status, "qwen-small") == ModelPosture.UNKNOWN
    # ... readiness the same trainer and GPU memory ...
    facts = standby_facts(domain, Policy())
    assert [(t.gpu_index, t.state) for t in facts.trainers] == [(0, "running")]
    assert [(g.index, g.used_mib, g.total_mib) for g in facts.gpus] == [(0, 40000.0, 81920.0)]
    # ... and the dashboard the same models, trainer and memory.
    card = next(
        c for c in fleet_page(seeded_fleet, now=clock.now())["domains"] if c["slug"] == "west"
    )
    [inference] = card["inference"]
    assert {m["name"]: m["reported_fp"] for m in inference["models"]} == {
        "llama-small": "sha256:ab",
        "qwen-small": "",
    }
    [bar] = card["gpus"]
    assert (bar.used_mib, bar.total_mib) == (40000, 81920)
    assert [(s.kind, s.mib) for s in bar.segments] == [("training", 38000), ("other", 2000)]


def test_a_row_stored_before_the_normalized_form_still_reads_everywhere(seeded_fleet):
    domain, _ = _west(seeded_fleet)
    old_row = {  # the status body as the previous release stored it, extra fields and all
        "slots": [
            {
                "gpuIndex": 0,
                "kind": "inference",
                "models": [
                    {"name": "llama-small", "port": 1, "sleeping": True, "process": {"pid": 101}},
                    {"name": "qwen-small", "port": 2, "sleeping": True, "engine": "sim"},
                ],
            },
            {
                "gpuIndex": 0,
                "kind": "training",
                "training": {"state": "idle", "pids": [], "adopted": False},
            },
        ],
        "ready": False,
        "host": "west",
        "gpus": [{"index": 0, "usedMiB": 1536, "totalMiB": 81920, "uuid": "GPU-1"}],
        "gpusAt": "2026-01-01T00:00:00Z",
        "heartbeat": {"ok": True, "checkedAt": "2026-01-01T00:00:01Z"},
    }
    Domain.objects.filter(pk=domain.pk).update(last_report=old_row)
    domain.refresh_from_db()

    report = read_report(domain.last_report)
    assert report.models()["llama-small"].pid == 101
    facts = standby_facts(domain, Policy())
    assert [(t.gpu_index, t.state) for t in facts.trainers] == [(0, "idle")]
    assert [(g.index, g.used_mib) for g in facts.gpus] == [(0, 1536.0)]
    card = next(
        c for c in fleet_page(seeded_fleet, now=clock.now())["domains"] if c["slug"] == "west"
    )
    assert card["has_report"] and card["report_error"] is None
    assert card["gpus"][0].used_mib == 1536
