"""Re-plan a domain from its rows (admin edits), and store what the plan granted.

The layout loader plans a file; an operator editing slots in admin changes the same rows, so
the domain is re-planned from the database with every slot pinned where it is: the question
is no longer "where should it go" but "does what is there still fit", answered with the same
planner and the same refusals.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from fleets.core.placement import Plan, PlanInputError
from fleets.core.report import read_report
from fleets.core.states import SlotKind
from fleets.layouts.planning import (
    UnitInput,
    expand_gpus,
    missing_need,
    placements,
    plan_units,
    planned_profile,
)
from fleets.models import Domain, ModelBinding, Slot


def _units(domain: Domain) -> tuple[list[UnitInput], list[Slot]]:
    slots = list(Slot.objects.filter(domain=domain).order_by("gpu_index", "kind"))
    bindings = list(ModelBinding.objects.filter(domain=domain).order_by("name"))
    units = [
        UnitInput.of_slot(
            f"slot gpu{slot.gpu_index}/{slot.kind}",
            slot,
            [b for b in bindings if b.slot_id == slot.id],
        )
        for slot in slots
    ]
    return units, slots


def domain_plan(*, domain: Domain) -> tuple[Plan | None, list[str]]:
    """Return (the plan of the domain's current slots, problems); (None, []) if unplanned."""
    if not domain.gpu_layout:
        return None, []
    gpus, errors = expand_gpus(domain.gpu_layout.get("gpus", []))
    units, _ = _units(domain)
    errors += missing_need(units)
    if errors:
        return None, errors
    try:
        result = plan_units(
            gpus,
            units,
            policy=domain.gpu_layout.get("placementPolicy", "binpack"),
            **(
                {"safety_margin_mib": domain.gpu_layout["safetyMarginMiB"]}
                if "safetyMarginMiB" in domain.gpu_layout
                else {}
            ),
        )
    except PlanInputError as exc:
        return None, [str(exc)]
    return result, [
        f"{r.workload}: refused on {r.target}: {r.reason} ({r.detail})" for r in result.refusals
    ]


def domain_plan_apply(*, domain: Domain) -> list[str]:
    """Re-plan the domain; store allocations and planned profiles when it fits.

    Returns the refusals (nothing is stored then). Only layout fields are written (allocation,
    GPU span, planned profile keys); state fields are never touched.
    """
    result, problems = domain_plan(domain=domain)
    if result is None or problems:
        return problems
    units, slots = _units(domain)
    where = placements(result)
    with transaction.atomic():
        for unit, slot in zip(units, slots, strict=True):
            placed = where[unit.label]
            allocation = {**placed.allocation, "pinned": slot.allocation.get("pinned", True)}
            Slot.objects.filter(pk=slot.pk).update(
                allocation=allocation, gpu_indices=list(placed.gpu_indices)
            )
            if slot.kind == SlotKind.INFERENCE:
                for b in ModelBinding.objects.filter(slot=slot):
                    grant = placed.allocation["servers"].get(b.name)
                    if grant is not None:
                        profile = planned_profile(
                            b.profile, placed.gpu_indices, grant["gpuMemoryUtilization"]
                        )
                        ModelBinding.objects.filter(pk=b.pk).update(profile=profile)
    return []


def gpus_from_report(report: Any) -> list[dict[str, Any]]:
    """Describe GPUs as a layout does (`index`, `type`, `memoryMiB`, `mig`) from a stored
    report (`fleets.core.report`)."""
    out: list[dict[str, Any]] = []
    for gpu in read_report(report).gpus:
        if gpu.total_mib is None:
            continue
        entry: dict[str, Any] = {
            "index": gpu.index,
            "type": gpu.name or "GPU",
            "memoryMiB": round(gpu.total_mib),
        }
        instances = [i for i in gpu.mig if i.total_mib is not None]
        if instances:
            entry["mig"] = [
                {
                    "name": f"gi{n if i.gpu_instance_id is None else i.gpu_instance_id}",
                    "memoryMiB": round(i.total_mib or 0),
                }
                for n, i in enumerate(instances)
            ]
        out.append(entry)
    return out


def domain_gpus_adopt(*, domain: Domain) -> list[str]:
    """Describe the domain's GPUs from its supervisor's last report, then re-plan it.

    Returns problems: no GPU in the report, or the planner's refusals (the description is
    kept either way: it is what the host has, and a refusal says what no longer fits on it).
    """
    gpus = gpus_from_report(domain.last_report)
    if not gpus:
        return [f"{domain.slug}: the last supervisor report names no GPU with its memory"]
    layout = {**domain.gpu_layout, "gpus": gpus}
    Domain.objects.filter(pk=domain.pk).update(gpu_layout=layout)
    domain.gpu_layout = layout
    return domain_plan_apply(domain=domain)
