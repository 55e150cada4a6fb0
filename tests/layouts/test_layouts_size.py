"""A huge layout is refused or accepted with a report whose size does not grow with its square.

The finding (issue 29): every "needs memoryMiB" line repeated the slot's label, which listed
every model, so 19,000 models gave 19,000 lines of 19,000 names (87 s, 13.2 GB in
`seed_layout`). Timings are `bench/layout_size.py`'s; these tests pin the shapes that keep the
work linear: bounded labels, bounded reports, the row limit before planning, a bounded plan.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from fleets.base.errors import MAX_ERROR_CHARS, MAX_REPORTED_ERRORS, LayoutError
from fleets.core.placement import (
    MAX_PLAN_PAIRS,
    NAMED_AT_MOST,
    GpuDevice,
    PlanInputError,
    PlanRequest,
    Server,
    ServerGroup,
    plan,
)
from fleets.layouts.loader import parse_layout


def _layout(models: list[dict], *, gpus: int = 1, per_slot: int | None = None) -> dict:
    per_slot = per_slot or len(models)
    slots = [
        {"kind": "inference", "gpuIndex": 0, "models": models[i : i + per_slot]}
        for i in range(0, len(models), per_slot)
    ]
    domain = {
        "slug": "east",
        "supervisorUrl": "https://10.0.0.1:8701",
        "gpus": [{"count": gpus, "type": "H100", "memoryMiB": 81559}],
        "slots": slots,
    }
    return {"slug": "big", "domains": [domain]}


def _models(count: int, **extra) -> list[dict]:
    return [
        {"name": f"model-{i:05d}", "servingUrl": f"http://10.0.0.2:{8000 + i % 1000}", **extra}
        for i in range(count)
    ]


def test_a_slot_of_thousands_of_models_without_memory_gives_a_bounded_report():
    with pytest.raises(LayoutError) as err:
        parse_layout(_layout(_models(3000)))
    errors = err.value.errors
    assert len(errors) == MAX_REPORTED_ERRORS + 1
    assert errors[-1] == (
        f"(layout): and {3000 - MAX_REPORTED_ERRORS} more error(s) not shown; "
        "fix these and check again"
    )
    first = errors[0]
    # The slot is named by its path and a few of its models, not by all 3,000.
    assert first.startswith("domains[0].slots[0] (model-00000, model-00001")
    assert f"and {3000 - NAMED_AT_MOST} more)" in first
    assert "needs memoryMiB or memoryFraction" in first
    assert all(len(e) <= MAX_ERROR_CHARS for e in errors)
    assert len(str(err.value)) < (MAX_REPORTED_ERRORS + 1) * MAX_ERROR_CHARS


def test_a_refused_slot_of_thousands_of_models_is_named_in_a_few_words():
    # 3,000 models of 1 MiB each need 3,000 x 82 MiB (vLLM's fraction rounds up to 0.001).
    with pytest.raises(LayoutError) as err:
        parse_layout(_layout(_models(3000, memoryMiB=1)))
    (refusal,) = err.value.errors
    assert "refused on GPU 0: insufficient_memory" in refusal
    assert "model-02999" not in refusal and len(refusal) < 400


def test_schema_errors_of_every_model_are_reported_bounded():
    models = [{**m, "name": m["name"].upper(), "memoryMiB": 1} for m in _models(2000)]
    with pytest.raises(LayoutError) as err:
        parse_layout(_layout(models, per_slot=10))
    assert len(err.value.errors) == MAX_REPORTED_ERRORS + 1
    assert err.value.errors[0].endswith(
        "must be lowercase (the routing key equals the served model name)"
    )
    assert "and 1950 more error(s)" in err.value.errors[-1]


def test_the_row_limit_is_checked_before_the_layout_is_checked_or_planned():
    # Over-full (planning refuses it) and over the row limit: the row limit answers.
    data = _layout(_models(300, memoryMiB=1))
    data["domains"][0]["slots"][0]["models"][0]["name"] = "UPPER"
    with pytest.raises(LayoutError) as err:
        parse_layout(data, max_rows=100)
    assert err.value.errors == [
        "domains: the layout names 302 rows (domains, slots and models), over the limit of 100 "
        "(HARU_LAYOUT_MAX_ROWS)"
    ]


def test_seed_layout_refuses_a_layout_over_the_row_limit_before_planning_it(tmp_path, settings):
    settings.HARU = {**settings.HARU, "layout_max_rows": 100}
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_layout(_models(300))))  # no memoryMiB: planning would refuse
    with pytest.raises(CommandError) as err:
        call_command("seed_layout", "--config", str(path), "--dry-run")
    assert "302 rows" in str(err.value) and "memoryMiB" not in str(err.value)


def test_a_workload_refused_by_every_gpu_names_a_few_and_counts_the_rest():
    gpus = tuple(GpuDevice(i, "H100", 81559) for i in range(64))
    huge = ServerGroup("huge", (Server("huge", memory_mib=200_000),))
    refusals = plan(PlanRequest(gpus=gpus, groups=(huge,))).refusals
    assert [r.target for r in refusals] == [
        *(f"GPU {i}" for i in range(NAMED_AT_MOST)),
        f"{64 - NAMED_AT_MOST} more targets",
    ]
    assert refusals[-1].reason == "insufficient_memory"
    assert refusals[-1].detail == f"insufficient_memory: {64 - NAMED_AT_MOST}"


def test_a_pin_to_a_missing_gpu_names_a_few_of_the_domain_s_gpus():
    gpus = tuple(GpuDevice(i, "H100", 81559) for i in range(64))
    lost = ServerGroup("lost", (Server("lost", memory_mib=10),), gpu_index=999)
    (refusal,) = plan(PlanRequest(gpus=gpus, groups=(lost,))).refusals
    assert refusal.reason == "no_such_gpu"
    assert refusal.detail == (
        f"GPU 999 is not in the domain (has GPU 0, GPU 1, GPU 2, GPU 3, GPU 4 and "
        f"{64 - NAMED_AT_MOST} more)"
    )


def test_a_plan_that_would_weigh_too_many_pairs_is_refused_before_it_starts():
    gpus = tuple(GpuDevice(i, "H100", 81559) for i in range(1024))
    count = MAX_PLAN_PAIRS // 1024 + 1
    groups = tuple(ServerGroup(f"g{i}", (Server(f"s{i}", memory_mib=10),)) for i in range(count))
    with pytest.raises(PlanInputError, match=r"1025 workloads on 1024 GPUs is too much to plan"):
        plan(PlanRequest(gpus=gpus, groups=groups))
    # Pinned workloads are weighed against their own GPU only.
    pinned = tuple(
        ServerGroup(f"g{i}", (Server(f"s{i}", memory_mib=10),), gpu_index=i % 1024)
        for i in range(count)
    )
    assert plan(PlanRequest(gpus=gpus, groups=pinned)).ok


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_latin1_layout_file_is_refused_naming_the_file_and_utf8(tmp_path, suffix):
    path = tmp_path / f"fleet{suffix}"
    data = _layout(_models(1, memoryMiB=1))
    data = {"displayName": "Flotte de Montréal", **data}
    path.write_bytes(json.dumps(data, ensure_ascii=False, indent=1).encode("latin-1"))
    with pytest.raises(CommandError) as err:
        call_command("seed_layout", "--config", str(path), "--dry-run")
    assert str(err.value) == (
        f"layout {path} refused, nothing written:\n"
        f"  {path}: not UTF-8 (byte 0xe9 on line 2); a layout must be saved as UTF-8"
    )
