"""Apply a validated layout to the database in one transaction, and report the difference.

Re-applying updates policy, names, URLs and slot specs of existing rows and adds new ones; rows
the file no longer names are reported and removed only with prune. The routing pointer is set
only when a fleet is created (revision 1) and never moved here: only operations move it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Model

from fleets import clock
from fleets.core.policy import validate_policy
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    SlotKind,
)
from fleets.core.urls import supervisor_url_problem, without_userinfo
from fleets.drivers.cloud_placement import PLACEMENT_FIELDS
from fleets.errors import LayoutError
from fleets.layouts.loader import DomainSpec, Layout, SlotSpec, plan_slots
from fleets.layouts.planning import PLANNED_PROFILE_KEYS
from fleets.models import Domain, Fleet, Id, ModelBinding, Operation, Slot
from fleets.services.events import event_record
from fleets.services.inventory import domain_add, slot_add


@dataclass
class LayoutReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # in the database, not in the file
    pruned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the file asks for but apply won't do
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("created", "updated", "unchanged", "extra", "pruned", "notes", "dry_run")
        }


class _DryRun(Exception):
    """Raised to roll back a dry run after the report is complete."""


def _sync(obj: Model, values: dict[str, Any], label: str, report: LayoutReport) -> None:
    """Set changed fields on an existing row (never state fields) and record the outcome."""
    changed = [k for k, v in values.items() if getattr(obj, k) != v]
    if changed:
        for k in changed:
            setattr(obj, k, values[k])
        # auto_now fields are written only when named in update_fields.
        stamp = ["updated_at"] if hasattr(obj, "updated_at") else []
        obj.save(update_fields=changed + stamp)
        report.updated.append(f"{label} ({', '.join(changed)})")
    else:
        report.unchanged.append(label)


def layout_apply(
    *, layout: Layout, prune: bool = False, dry_run: bool = False, actor: str = "seed_layout"
) -> LayoutReport:
    """Create or update the fleet described by `layout`; return what changed."""
    _refuse_supervisor_hosts(layout)
    report = LayoutReport(dry_run=dry_run)
    try:
        with transaction.atomic():
            _apply(layout, prune, report, actor)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return report


def _refuse_supervisor_hosts(layout: Layout) -> None:
    """Refuse, before writing anything, a supervisor URL Haru would never call (credentials in
    it, or a host outside HARU_SUPERVISOR_HOSTS)."""
    patterns = settings.HARU["supervisor_hosts"]
    errors = [
        f"domains[{i}].supervisorUrl: {problem}"
        for i, d in enumerate(layout.domains)
        if d.supervisor_url and (problem := supervisor_url_problem(d.supervisor_url, patterns))
    ]
    if errors:
        raise LayoutError(errors)


def _apply(layout: Layout, prune: bool, report: LayoutReport, actor: str) -> None:
    now = clock.now()
    existing = Fleet.objects.filter(slug=layout.slug).first()
    new_fleet = existing is None
    if existing is None:
        fleet = Fleet.objects.create(
            slug=layout.slug, display_name=layout.display_name, policy=layout.policy
        )
        report.created.append(f"fleet {layout.slug}")
    else:
        fleet = existing
        _sync(
            fleet,
            {"display_name": layout.display_name, "policy": layout.policy},
            f"fleet {layout.slug}",
            report,
        )

    # The posture new inference slots start in follows the live pointer, or for a new fleet the
    # declared active domain; the next heartbeats correct it from what supervisors report.
    live_active_slug = (
        None
        if new_fleet or fleet.active_domain_id is None
        else Domain.objects.get(pk=fleet.active_domain_id).slug
    )
    serving_slug = layout.active_domain_slug if new_fleet else live_active_slug
    if not new_fleet and layout.active_domain_slug not in (None, live_active_slug):
        # Say so rather than stay silent: an operator editing the file may expect a switch.
        routes = f"routes to {live_active_slug!r}" if live_active_slug else "has no active domain"
        report.notes.append(
            f"activeDomainSlug {layout.active_domain_slug!r} is not applied: the fleet {routes} "
            f"(revision {fleet.route_revision}); a layout never moves routing, promote "
            f"{layout.active_domain_slug!r} to switch"
        )

    kept_domains: set[Id] = set()
    kept_slots: set[Id] = set()
    kept_bindings: set[Id] = set()
    for d in layout.domains:
        label = f"domain {layout.slug}/{d.slug}"
        values = {
            "display_name": d.display_name,
            "provider": d.provider,
            "priority": d.priority,
            "placement": d.placement,
            "gpu_layout": d.gpu_layout,
            "driver": d.driver,
        }
        # A provisioned domain's URLs come from its cluster (fleets.services.provisioning);
        # re-applying the file must not blank them.
        if not d.driver or d.supervisor_url:
            values["supervisor_url"] = d.supervisor_url
        if not d.driver or d.serving_base_url:
            values["serving_base_url"] = d.serving_base_url
        domain = Domain.objects.filter(fleet=fleet, slug=d.slug).first()
        if domain is None:
            domain = domain_add(domain=Domain(fleet=fleet, slug=d.slug, **values), now=now)
            report.created.append(label)
        else:
            _sync(domain, values, label, report)
        kept_domains.add(domain.id)

        for s in _keep_placements(d, domain, f"domains[{layout.domains.index(d)}]", report):
            slabel = f"slot {layout.slug}/{d.slug}/gpu{s.gpu_index}/{s.kind}"
            placed = {
                "spec": s.spec,
                "gpu_indices": s.gpu_indices or [s.gpu_index],
                "mig_instance": s.mig_instance,
                "allocation": s.allocation,
            }
            slot = Slot.objects.filter(domain=domain, gpu_index=s.gpu_index, kind=s.kind).first()
            if slot is None:
                slot = slot_add(
                    slot=Slot(domain=domain, gpu_index=s.gpu_index, kind=s.kind, **placed),
                    on_active=d.slug == serving_slug,
                    now=now,
                )
                report.created.append(slabel)
            else:
                _sync(slot, placed, slabel, report)
            kept_slots.add(slot.id)

            for m in s.models:
                mlabel = f"model {layout.slug}/{d.slug}/{m.name}"
                binding = ModelBinding.objects.filter(domain=domain, name=m.name).first()
                bvalues = {
                    "slot_id": slot.id,
                    "serving_url": m.serving_url,
                    "profile": m.profile,
                    "memory": m.memory,
                    "golden": m.golden,
                }
                if d.driver and not m.serving_url and binding is not None:
                    del bvalues["serving_url"]  # set from the cluster at provisioning
                if binding is None:
                    binding = ModelBinding.objects.create(domain=domain, name=m.name, **bvalues)
                    report.created.append(mlabel)
                else:
                    _sync(binding, bvalues, mlabel, report)
                kept_bindings.add(binding.id)

    if new_fleet and layout.active_domain_slug:
        active = Domain.objects.get(fleet=fleet, slug=layout.active_domain_slug)
        # Setting the pointer of a fleet created in this very transaction; revision stays 1.
        Fleet.objects.filter(pk=fleet.pk, active_domain__isnull=True).update(active_domain=active)

    _report_extras(fleet, kept_domains, kept_slots, kept_bindings, prune, report)
    event_record(
        fleet_id=fleet.id,
        kind="layout.applied",
        actor=actor,
        data={
            "created": len(report.created),
            "updated": len(report.updated),
            "extra": len(report.extra),
            "pruned": len(report.pruned),
        },
    )


def _keep_placements(
    d: DomainSpec, domain: Domain, dpath: str, report: LayoutReport
) -> list[SlotSpec]:
    """Re-plan a planned domain that already runs with its slots kept where they are.

    Planning from scratch could move a running server to another GPU just because a new slot
    was added. Units the layout does not pin are pinned to the GPU their models (or, for a
    trainer, its checkpoint dir) are on now; when that no longer fits, the fresh plan stands
    and the report says so.
    """
    if not d.gpu_layout or not d.unplanned:
        return d.slots
    where = {
        b.name: b.slot.gpu_index
        for b in ModelBinding.objects.filter(domain=domain).select_related("slot")
        if not b.slot.mig_instance
    }
    trainers = {
        s.spec.get("checkpointDir"): s.gpu_index
        for s in Slot.objects.filter(domain=domain, kind=SlotKind.TRAINING, mig_instance="")
    }
    units = copy.deepcopy(d.unplanned)
    kept = False
    for u in units:
        if u.gpu_index is not None or u.mig_instance:
            continue
        if u.kind == SlotKind.TRAINING:
            gpus = {trainers.get(u.spec.get("checkpointDir"))} - {None}
        elif any(int(m.profile.get("tensorParallel", 1) or 1) > 1 for m in u.models):
            continue  # a tensor-parallel group is placed whole, first: it lands where it was
        else:
            gpus = {where.get(m.name) for m in u.models} - {None}
        if len(gpus) == 1:
            u.gpu_index, u.sticky, kept = gpus.pop(), True, True
    if not kept:
        return d.slots
    errors: list[str] = []
    slots = plan_slots(d.gpu_layout, units, dpath, errors, count=False)
    if errors:
        report.notes.append(
            f"domain {d.slug}: the current placement no longer fits ({errors[0]}); "
            "planned from scratch, so some slots move"
        )
        return d.slots
    return slots


def _report_extras(
    fleet: Fleet,
    kept_domains: set[Id],
    kept_slots: set[Id],
    kept_bindings: set[Id],
    prune: bool,
    report: LayoutReport,
) -> None:
    extra_bindings = (
        ModelBinding.objects.filter(domain__fleet=fleet)
        .exclude(id__in=kept_bindings)
        .select_related("domain")
    )
    extra_slots = (
        Slot.objects.filter(domain__fleet=fleet).exclude(id__in=kept_slots).select_related("domain")
    )
    extra_domains = Domain.objects.filter(fleet=fleet).exclude(id__in=kept_domains)
    for b in extra_bindings:
        report.extra.append(f"model {fleet.slug}/{b.domain.slug}/{b.name}")
    for s in extra_slots:
        report.extra.append(f"slot {fleet.slug}/{s.domain.slug}/gpu{s.gpu_index}/{s.kind}")
    for d in extra_domains:
        report.extra.append(f"domain {fleet.slug}/{d.slug}")
    if not prune:
        return
    fleet.refresh_from_db(fields=["active_domain"])
    blocked = [d.slug for d in extra_domains if d.id == fleet.active_domain_id]
    if blocked:
        raise LayoutError(
            [
                f"domains: cannot prune {blocked[0]!r}: it is the active domain; "
                f"promote another domain first"
            ]
        )
    if Operation.objects.filter(fleet=fleet, state__in=IN_FLIGHT_OPERATION_STATES).exists():
        raise LayoutError(["domains: cannot prune while an operation is in flight"])
    report.pruned = list(report.extra)
    extra_bindings.delete()
    extra_slots.delete()
    extra_domains.delete()


# Postgres jsonb does not keep key order; export in the layout format's own order so a file
# exported from either database diffs cleanly against the one it came from.
_PLACEMENT_ORDER = PLACEMENT_FIELDS
_TRAINING_ORDER = ("command", "checkpointDir")
_GPU_ORDER = ("index", "count", "type", "memoryMiB", "nvlinkGroup", "numaNode", "mig")


def _export_slot(s: Slot, planned: bool, provisioned: bool) -> dict[str, Any]:
    """One slot in the layout format; a planned slot leaves out what the planner chose."""
    out: dict[str, Any] = {"kind": s.kind}
    if not planned or s.allocation.get("pinned", True):
        out["gpuIndex"] = s.gpu_index
    if s.mig_instance and (not planned or s.allocation.get("pinned", True)):
        out["migInstance"] = s.mig_instance
    if s.kind == SlotKind.TRAINING:
        return {**out, **_ordered(s.spec, _TRAINING_ORDER)}
    out["sleepLevel"] = s.spec.get("sleepLevel", 1)
    out.update({k: s.spec[k] for k in ("gpuType", "topology") if k in s.spec})
    granted = s.allocation.get("servers", {})
    models: list[dict[str, Any]] = []
    for b in ModelBinding.objects.filter(slot=s).order_by("name"):
        m: dict[str, Any] = {"name": b.name}
        # A provisioned domain's serving URLs belong to its current cluster, not to the layout.
        if not provisioned:
            m["servingUrl"] = without_userinfo(b.serving_url)
        profile = dict(b.profile)
        memory = dict(b.memory)
        if planned:
            for key in PLANNED_PROFILE_KEYS:
                profile.pop(key, None)
            need = ("memoryMiB", "memoryFraction", "exclusive")
            if not any(k in memory for k in need) and b.name in granted:
                # The need came from the profile's own fraction; keep it as the request.
                memory["memoryFraction"] = granted[b.name]["gpuMemoryUtilization"]
        m.update(_ordered(memory))
        m.update({k: b.golden[k] for k in ("deterministic", "adapters") if k in b.golden})
        if profile:
            m["profile"] = _ordered(profile)
        models.append(m)
    out["models"] = models
    return out


def _ordered(value: dict[str, Any], order: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return `value` with the keys of `order` first, in that order, then the rest sorted."""
    rest = sorted(k for k in value if k not in order)
    return {k: value[k] for k in (*[k for k in order if k in value], *rest)}


def layout_export(fleet: Fleet) -> dict[str, Any]:
    """Return the fleet as a layout document that layout_apply accepts unchanged."""
    doc: dict[str, Any] = {"slug": fleet.slug}
    if fleet.display_name:
        doc["displayName"] = fleet.display_name
    if fleet.active_domain_id:
        doc["activeDomainSlug"] = Domain.objects.get(pk=fleet.active_domain_id).slug
    if fleet.policy:
        doc["policy"] = validate_policy(fleet.policy)  # keys in the policy table's order
    doc["domains"] = []
    for d in Domain.objects.filter(fleet=fleet).order_by("priority", "slug"):
        dd: dict[str, Any] = {"slug": d.slug}
        if d.display_name:
            dd["displayName"] = d.display_name
        dd["provider"] = d.provider
        dd["priority"] = d.priority
        if d.placement:
            dd["placement"] = _ordered(d.placement, _PLACEMENT_ORDER)
        if d.driver:
            dd["driver"] = d.driver
        # A provisioned domain's URLs belong to its current cluster, not to the layout.
        if d.supervisor_url and not d.driver:
            dd["supervisorUrl"] = without_userinfo(d.supervisor_url)
        if d.serving_base_url and not d.driver:
            dd["servingBaseUrl"] = without_userinfo(d.serving_base_url)
        planned = bool(d.gpu_layout)
        if planned:
            dd["gpus"] = [_ordered(g, _GPU_ORDER) for g in d.gpu_layout.get("gpus", [])]
            for key in ("placementPolicy", "safetyMarginMiB"):
                if key in d.gpu_layout:
                    dd[key] = d.gpu_layout[key]
        dd["slots"] = [
            _export_slot(s, planned, bool(d.driver))
            for s in Slot.objects.filter(domain=d).order_by("gpu_index", "kind")
        ]
        doc["domains"].append(dd)
    return doc
