"""Per GPU: planned memory per workload next to measured memory, residue apart; metrics."""

from __future__ import annotations

import copy

import pytest

from fleets.base.errors import LayoutError
from fleets.core.allocation import gpu_allocations, plan_mismatches
from fleets.core.report import read_report
from fleets.dashboard.selectors import fleet_page
from fleets.layouts.loader import parse_layout
from fleets.layouts.planning import PLACEMENT_REFUSALS
from fleets.models import Domain, ModelBinding, Slot

REPORT = {
    "slots": [
        {
            "gpuIndex": 0,
            "kind": "inference",
            "models": [
                {"name": "llama-small", "sleeping": True, "pid": 101},
                {"name": "qwen-small", "sleeping": True, "pid": 102},
            ],
        },
        {"gpuIndex": 0, "kind": "training", "models": [], "training": {"pids": [200]}},
    ],
    "gpus": [
        {
            "index": 0,
            "usedMiB": 40000,
            "totalMiB": 81920,
            "processes": [
                {"pid": 101, "usedMiB": 768},
                {"pid": 102, "usedMiB": 768},
                {"pid": 200, "usedMiB": 38000},
            ],
        }
    ],
    "planMismatches": [
        {"gpuIndex": 0, "code": "gpu_type_mismatch", "message": "GPU 0 is planned as 'H100'"}
    ],
}


@pytest.fixture
def west(seeded_fleet):
    domain = Domain.objects.get(fleet=seeded_fleet, slug="west")
    Domain.objects.filter(pk=domain.pk).update(last_report=REPORT)
    domain.refresh_from_db()
    return domain


def allocations(domain):
    return gpu_allocations(
        Slot.objects.filter(domain=domain),
        ModelBinding.objects.filter(domain=domain),
        read_report(REPORT),
    )


@pytest.mark.django_db
def test_each_workload_shows_planned_residue_and_measured_memory(west):
    (gpu,) = allocations(west)
    rows = {w.name: (w.kind, w.planned_mib, w.residue_mib, w.measured_mib) for w in gpu.workloads}
    assert rows == {
        "llama-small": ("server", 9012, 768, 768),
        "qwen-small": ("server", 6964, 768, 768),
        "trainer": ("trainer", 40960, 0, 38000),
    }
    assert (gpu.planned_awake_mib, gpu.planned_residue_mib, gpu.planned_trainer_mib) == (
        15976,
        1536,
        40960,
    )
    assert gpu.sharing == 3


def test_plan_mismatches_are_read_from_the_report():
    assert plan_mismatches(read_report(REPORT)) == ["GPU 0 is planned as 'H100'"]
    assert plan_mismatches(read_report({})) == [] and plan_mismatches(read_report(None)) == []


@pytest.mark.django_db
def test_fleet_page_shows_the_allocation_and_the_mismatch(west, client, django_user_model):
    staff = django_user_model.objects.create_user(
        "ops", password="pw", is_staff=True, is_superuser=True
    )
    client.force_login(staff)
    html = client.get("/fleets/demo/live/").content.decode()
    assert "plan vs host: GPU 0 is planned as &#x27;H100&#x27;" in html
    assert "asleep keeps" in html and "40960 MiB" in html and "38000 MiB" in html
    assert "40000 / 81920 MiB (48.8%)" in html  # the bar's share of the GPU, as the number says


@pytest.mark.django_db
def test_metrics_expose_allocated_used_and_sharing_per_gpu(west, client):
    text = client.get("/metrics").content.decode()
    base = 'domain="west",fleet="demo",gpu="0"'
    assert f"haru_gpu_shared_count{{{base}}} 3.0" in text
    assert (
        f'haru_gpu_memory_allocated_mib{{{base},posture="asleep",workload="llama-small"}} 768.0'
        in text
    )
    assert (
        f'haru_gpu_memory_allocated_mib{{{base},posture="training",workload="trainer"}} 40960.0'
        in text
    )
    assert f'haru_gpu_memory_used_mib{{{base},workload="trainer"}} 38000.0' in text


def test_refusals_are_counted_by_reason(layout_data):
    before = PLACEMENT_REFUSALS.labels(reason="insufficient_memory")._value.get()
    data = copy.deepcopy(layout_data)
    data["domains"][0]["slots"][1]["memoryBudgetMiB"] = 81000
    with pytest.raises(LayoutError):
        parse_layout(data)
    after = PLACEMENT_REFUSALS.labels(reason="insufficient_memory")._value.get()
    assert after == before + 1


def test_the_memory_table_and_the_slot_list_agree_on_a_model_woken_since_the_report(
    west, fake_clock
):
    """A promotion proved west's wake after its last heartbeat (which said asleep): the slot
    list read "awake" and the memory table "(asleep)" in the same frame."""
    Domain.objects.filter(pk=west.pk).update(last_seen_at=fake_clock.now())
    fake_clock.advance(ms=500)
    Slot.objects.filter(domain=west, kind="inference").update(
        state="serving", state_updated_at=fake_clock.now()
    )

    card = next(
        d for d in fleet_page(west.fleet, now=fake_clock.now())["domains"] if d["slug"] == "west"
    )

    postures = {m["name"]: m["posture"] for row in card["inference"] for m in row["models"]}
    asleep = {
        w.name: w.asleep for a in card["allocations"] for w in a.workloads if w.kind == "server"
    }
    assert postures == {"llama-small": "awake", "qwen-small": "awake"}
    assert asleep == {"llama-small": False, "qwen-small": False}
