"""Layouts without GPU indices: the planner places them, and refuses over-full ones with numbers."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fleets.base.errors import LayoutError
from fleets.layouts.loader import load_layout, parse_layout, read_layout_file
from fleets.models import ModelBinding, Slot
from fleets.services.layouts import layout_apply

ROOT = Path(__file__).resolve().parents[2]
TWO_DOMAIN = ROOT / "examples" / "fleet.two-domain.json"
THREE_DOMAIN = ROOT / "examples" / "fleet.three-domain.yaml"


def placed(layout, domain: str) -> dict:
    d = next(x for x in layout.domains if x.slug == domain)
    return {
        (s.kind, tuple(m.name for m in s.models)): (tuple(s.gpu_indices), s.allocation)
        for s in d.slots
    }


def test_two_domain_example_plans_the_bundle_and_trainer_onto_the_one_gpu():
    layout = load_layout(TWO_DOMAIN)
    for domain in ("east", "west"):
        plan = placed(layout, domain)
        (gpus, bundle) = plan[("inference", ("llama-small", "qwen-small"))]
        assert gpus == (0,)
        assert bundle["servers"]["llama-small"]["gpuMemoryUtilization"] == 0.11
        assert bundle["servers"]["qwen-small"]["gpuMemoryUtilization"] == 0.085
        (gpus, trainer) = plan[("training", ())]
        assert gpus == (0,) and trainer["budgetMiB"] == 40960


def test_three_domain_example_plans_what_the_operator_used_to_pick_by_hand():
    layout = load_layout(THREE_DOMAIN)
    for domain in ("aws-use1", "gcp-usc1"):
        plan = placed(layout, domain)
        # The large model alone on GPU 0; the small one and the trainer share GPU 1.
        assert plan[("inference", ("qwen3-8b",))][0] == (0,)
        assert plan[("inference", ("llama-3.1-8b-instruct",))][0] == (1,)
        gpus, trainer = plan[("training", ())]
        assert gpus == (1,)
        assert trainer["budgetMiB"] == 81559 - 3072 - 1024  # total - residue - margin
    spot = placed(layout, "aws-usw2-spot")
    assert spot[("inference", ("qwen3-8b", "llama-3.1-8b-instruct"))][0] == (0,)


def _over_full(data: dict) -> dict:
    data = copy.deepcopy(data)
    data["domains"][0]["slots"][0]["models"].append(
        {"name": "huge", "servingUrl": "http://127.0.0.1:18009", "memoryMiB": 70000}
    )
    return data


def test_an_over_full_layout_is_refused_with_the_numbers():
    with pytest.raises(LayoutError) as err:
        parse_layout(_over_full(read_layout_file(TWO_DOMAIN)))
    assert err.value.errors == [
        "domains[0].slots[0] (llama-small, qwen-small, huge): refused on GPU 0: "
        "insufficient_memory (needs 86018 MiB, 80896 MiB free of 81920 MiB "
        "(0 MiB planned, 1024 MiB margin))"
    ]


def test_a_trainer_budget_beyond_what_sleeping_servers_leave_is_refused():
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    data["domains"][1]["slots"][1]["memoryBudgetMiB"] = 80000
    with pytest.raises(LayoutError) as err:
        parse_layout(data)
    (line,) = err.value.errors
    assert line.startswith("domains[1].slots[1] (trainer): refused on GPU 0: insufficient_memory")
    assert "budget 80000 MiB > 79360 MiB: 81920 MiB total - 1536 MiB sleeping residue" in line


def test_a_layout_must_say_what_memory_a_shared_server_needs():
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    del data["domains"][0]["slots"][0]["models"][0]["memoryMiB"]
    with pytest.raises(LayoutError, match="needs memoryMiB or memoryFraction"):
        parse_layout(data)


def test_without_a_gpu_description_gpu_indices_stay_required():
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    del data["domains"][0]["gpus"]
    with pytest.raises(LayoutError) as err:
        parse_layout(data)
    assert (
        "domains[0].slots[0].gpuIndex: is required when the domain does not describe its gpus"
        in (err.value.errors)
    )


def test_two_slots_without_gpu_indices_are_reported_not_a_crash():
    # Both default to GPU 0 after the "required" error: the duplicate is said as one more
    # error (it once read the missing gpuIndex for its message and raised KeyError).
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    east = data["domains"][0]
    del east["gpus"]
    east["slots"].append({"kind": "inference", "models": [{"name": "tiny"}]})
    for slot in east["slots"]:
        slot.pop("gpuIndex", None)
    with pytest.raises(LayoutError) as err:
        parse_layout(data)
    assert any(": duplicate inference slot on GPU 0 (also " in e for e in err.value.errors)


def test_planned_slot_merge_keeps_one_inference_slot_per_gpu():
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    data["domains"][0]["slots"].append(
        {"kind": "inference", "models": [{"name": "tiny", "memoryMiB": 2048}]}
    )
    east = parse_layout(data).domains[0]
    inference = [s for s in east.slots if s.kind == "inference"]
    assert len(inference) == 1
    assert [m.name for m in inference[0].models] == ["llama-small", "qwen-small", "tiny"]


def test_tensor_parallel_server_spans_a_gpu_group_in_the_database(db):
    data = copy.deepcopy(read_layout_file(THREE_DOMAIN))
    use1 = data["domains"][0]
    use1["gpus"] = [{"count": 4, "type": "H100", "memoryMiB": 81559, "numaNode": 0}]
    use1["slots"].append(
        {
            "kind": "inference",
            "models": [
                {
                    "name": "llama-70b",
                    "servingUrl": "https://use1.gpu.example.internal/70b",
                    "profile": {"engine": "vllm", "modelPath": "meta/70b", "tensorParallel": 2},
                }
            ],
        }
    )
    layout_apply(layout=parse_layout(data))
    binding = ModelBinding.objects.get(domain__slug="aws-use1", name="llama-70b")
    assert binding.slot.gpu_indices == [0, 1]  # whole GPUs first, the lowest pair
    assert binding.profile["gpus"] == [0, 1]
    assert binding.profile["gpuMemoryUtilization"] == 0.987
    spans = sorted((s.gpu_indices, s.kind) for s in Slot.objects.filter(domain__slug="aws-use1"))
    assert spans == [
        ([0, 1], "inference"),
        ([2], "inference"),
        ([3], "inference"),
        ([3], "training"),
    ]


def test_seed_layout_prints_the_planners_refusal(db, tmp_path):
    path = tmp_path / "full.json"
    path.write_text(json.dumps(_over_full(read_layout_file(TWO_DOMAIN))))
    with pytest.raises(CommandError) as err:
        call_command("seed_layout", "--config", str(path))
    assert "refused on GPU 0: insufficient_memory (needs 86018 MiB" in str(err.value)
    assert not Slot.objects.exists()


def test_a_profile_copied_from_a_host_config_pins_its_gpus():
    data = copy.deepcopy(read_layout_file(TWO_DOMAIN))
    east = data["domains"][0]
    east["gpus"][0]["count"] = 2
    east["slots"][0]["models"][0]["profile"]["gpus"] = [1]
    placed_slots = parse_layout(data).domains[0].slots
    inference = next(s for s in placed_slots if s.kind == "inference")
    assert inference.gpu_indices == [1] and inference.allocation["pinned"] is True
    east["slots"][0]["gpuIndex"] = 0
    with pytest.raises(
        LayoutError, match="profile.gpus: starts at GPU 1, the slot's gpuIndex is 0"
    ):
        parse_layout(data)


def _with_a_large_model(data: dict) -> dict:
    data = copy.deepcopy(data)
    for i, domain in enumerate(data["domains"]):
        domain["gpus"][0]["count"] = 2
        domain["slots"].append(
            {
                "kind": "inference",
                "models": [
                    {"name": f"big-{i}", "servingUrl": "http://127.0.0.1:18030", "exclusive": True}
                ],
            }
        )
    return data


def test_reapplying_with_a_new_slot_keeps_running_slots_where_they_are(seeded_fleet, layout_data):
    # From scratch, binpack would give the new whole-GPU model GPU 0 and move the bundle.
    fresh = parse_layout(_with_a_large_model(layout_data)).domains[0]
    assert {s.gpu_index for s in fresh.slots if s.models and s.models[0].name == "big-0"} == {0}

    report = layout_apply(layout=parse_layout(_with_a_large_model(layout_data)))

    spans = sorted(
        (s.domain.slug, s.kind, s.gpu_indices)
        for s in Slot.objects.filter(domain__fleet=seeded_fleet).select_related("domain")
    )
    assert spans == [
        ("east", "inference", [0]),
        ("east", "inference", [1]),
        ("east", "training", [0]),
        ("west", "inference", [0]),
        ("west", "inference", [1]),
        ("west", "training", [0]),
    ]
    assert ModelBinding.objects.get(name="big-0").slot.gpu_index == 1
    assert report.extra == [] and report.notes == []
    # Kept, not pinned by the operator: an export still leaves the GPU to the planner.
    bundle = Slot.objects.get(domain__slug="east", kind="inference", gpu_index=0)
    assert bundle.allocation["pinned"] is False


def test_when_the_current_placement_no_longer_fits_the_fresh_plan_stands(seeded_fleet, layout_data):
    data = _with_a_large_model(layout_data)
    data["domains"][0]["gpus"][0]["count"] = 3
    # More than GPU 0 has left next to the sleeping bundle (79360 MiB): the trainer must move.
    data["domains"][0]["slots"][1]["memoryBudgetMiB"] = 79500
    report = layout_apply(layout=parse_layout(data))
    assert len(report.notes) == 1
    assert report.notes[0].startswith("domain east: the current placement no longer fits (")
    assert "planned from scratch, so some slots move" in report.notes[0]
    trainers = Slot.objects.filter(domain__slug="east", kind="training")
    assert sorted(t.gpu_index for t in trainers) == [0, 2]  # the old row stays until --prune
    assert "slot demo/east/gpu0/training" in report.extra
