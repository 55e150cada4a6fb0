"""Apply a validated layout to the database in bounded batches, and report the difference.

Re-applying updates policy, names, URLs and slot specs of existing rows and adds new ones; rows
the file no longer names are reported and removed only with prune. The routing pointer is set
only when a fleet is created (revision 1) and never moved here: only operations move it.

A layout is applied in two phases (docs/layouts-batching.md). First the whole difference is
planned from a few reads, with no transaction open: everything the file could be refused for is
refused then, with nothing written. Then the planned writes run in transactions of at most
`HARU_LAYOUT_BATCH_ROWS` rows, so no write lock is held for longer than one batch and the
reconcile tick writes its heartbeats between them. The order keeps every invariant a reader
relies on at every batch boundary: the fleet row, then domains, then slots, then models (a row
never exists before what it points at), then a new fleet's routing pointer (so a half-built new
fleet routes nothing and has no active domain to fail over), then the `layout.applied` event,
then prune deletes (models, slots, domains). A failed apply leaves a prefix of that order;
re-applying the same file completes it. One apply per fleet at a time, held by the lease
`layout:<slug>`.

Rollouts (docs/rollouts.md, "Layouts and rollouts"): while one is in flight, an apply that would
change a domain, slot or model of its fleet is refused (it holds the standby and moves its
binding), checked at planning and again in every batch's transaction. After one moved a model to
a new version, an apply whose file still names the old profile or serving URL of that model is
refused, unless `revert_rollout` says to put the file's values back in the database record.
"""

from __future__ import annotations

import copy
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Model

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.base.errors import LayoutBehindRollout, LayoutError, LayoutRolloutConflict
from fleets.core.policy import validate_policy
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    Provider,
    SlotKind,
)
from fleets.core.supervisor_tls import TLS
from fleets.core.urls import supervisor_url_problem, without_userinfo
from fleets.drivers.cloud_placement import PLACEMENT_FIELDS
from fleets.drivers.registry import builtin, provider_names
from fleets.layouts.loader import DomainSpec, Layout, SlotSpec, plan_slots, rows_problem
from fleets.layouts.planning import PLANNED_PROFILE_KEYS
from fleets.models import Domain, Fleet, Id, ModelBinding, Operation, Rollout, Slot
from fleets.services.events import event_record
from fleets.services.inventory import domain_add, slot_add
from fleets.services.leases import lease_acquire, lease_release, lease_renew

# Long enough for any one batch; renewed after each, so a crashed apply frees the fleet soon.
_LEASE_TTL = timedelta(seconds=60)


@dataclass
class LayoutReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)  # in the database, not in the file
    pruned: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the file asks for but apply won't do
    dry_run: bool = False
    batches: int = 0  # write transactions the apply committed

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "created",
                "updated",
                "unchanged",
                "extra",
                "pruned",
                "notes",
                "dry_run",
                "batches",
            )
        }


# Keys the planned writes use to find rows created by an earlier write of the same apply.
_Key = tuple[Any, ...]
_Ids = dict[_Key, Any]


@dataclass
class _Plan:
    """The writes of one apply, in the order they must run (module docstring)."""

    rows: list[Callable[[_Ids], None]] = field(default_factory=list)
    # New models are inserted in bulk, after the row writes of their batch (their slots come
    # earlier in the order, so they exist by then).
    bindings: list[Callable[[_Ids], ModelBinding]] = field(default_factory=list)
    tail: list[Callable[[_Ids], None]] = field(default_factory=list)  # a new fleet's pointer
    prune: list[Callable[[_Ids], None]] = field(default_factory=list)
    prune_check: Callable[[], None] | None = None
    # Set when the plan changes a domain, slot or model: no rollout may be in flight meanwhile.
    rollout_check: Callable[[], None] | None = None
    final: list[Callable[[_Ids], None]] = field(default_factory=list)  # the applied event


def _changed(obj: Model, values: dict[str, Any]) -> list[str]:
    return [k for k, v in values.items() if getattr(obj, k) != v]


def _sync(obj: Model, values: dict[str, Any], label: str, report: LayoutReport) -> list[str]:
    """Record the outcome for an existing row and return the fields the write will change.

    The write itself (`_save`) runs later, in its batch; it never touches state fields.
    """
    changed = _changed(obj, values)
    if changed:
        report.updated.append(f"{label} ({', '.join(changed)})")
    else:
        report.unchanged.append(label)
    return changed


def _save(obj: Model, values: dict[str, Any], changed: list[str]) -> None:
    for k in changed:
        setattr(obj, k, values[k])
    # auto_now fields are written only when named in update_fields.
    stamp = ["updated_at"] if hasattr(obj, "updated_at") else []
    obj.save(update_fields=changed + stamp)


def layout_rows(layout: Layout) -> int:
    """The rows a layout names: its domains, slots and models."""
    return sum(1 + len(d.slots) + sum(len(s.models) for s in d.slots) for d in layout.domains)


def layout_apply(
    *,
    layout: Layout,
    prune: bool = False,
    dry_run: bool = False,
    actor: str = "seed_layout",
    on_batch: Callable[[int, int], None] | None = None,
    revert_rollout: bool = False,
) -> LayoutReport:
    """Create or update the fleet described by `layout`; return what changed.

    `on_batch(done, total)` is called after each committed batch, outside any transaction
    (`seed_layout` prints progress with it). `revert_rollout`: write the file's profile and
    serving URL over a model a finished rollout moved, which is otherwise refused
    (LayoutBehindRollout); the hosts are not changed.
    """
    _refuse_supervisor_hosts(layout)
    # `seed_layout` refused such a file before planning it; a Layout built otherwise is
    # refused here.
    too_many = rows_problem(layout_rows(layout), haru_settings().layout_max_rows)
    if too_many:
        raise LayoutError([too_many])
    report = LayoutReport(dry_run=dry_run)
    if dry_run:
        _plan(layout, prune, report, actor, revert_rollout)
        return report
    lease = f"layout:{layout.slug}"
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    taken = lease_acquire(name=lease, holder=holder, now=clock.now(), ttl=_LEASE_TTL)
    if not taken.acquired:
        raise LayoutError(
            [f"slug: fleet {layout.slug!r} is being applied by {taken.holder}; try again later"]
        )
    try:
        plan = _plan(layout, prune, report, actor, revert_rollout)
        _write(plan, lease, holder, report, on_batch)
    finally:
        lease_release(name=lease, holder=holder)
    return report


def _write(
    plan: _Plan,
    lease: str,
    holder: str,
    report: LayoutReport,
    on_batch: Callable[[int, int], None] | None,
) -> None:
    """Run the planned writes in transactions of at most HARU_LAYOUT_BATCH_ROWS rows."""
    size = haru_settings().layout_batch_rows
    pause_s = haru_settings().layout_batch_pause_ms / 1000
    # Rows first, then new models: every new model's slot is in `rows`, so a batch boundary
    # inside either list keeps "a row never before what it points at".
    steps: list[tuple[str, Callable[[_Ids], Any]]] = [
        *(("row", f) for f in plan.rows),
        *(("binding", f) for f in plan.bindings),
    ]
    batches = [steps[i : i + size] for i in range(0, len(steps), size)]
    # A new fleet's pointer goes with the last batch of rows (or alone, for an empty plan).
    tail = [("row", f) for f in plan.tail]
    if batches and len(batches[-1]) + len(tail) <= size:
        batches[-1].extend(tail)
    else:
        batches.append(tail)
    first_prune = len(batches)
    batches += [
        [("row", f) for f in plan.prune[i : i + size]] for i in range(0, len(plan.prune), size)
    ]
    # The event last, so it counts only what is done (one row over the batch size at most).
    batches[-1].extend(("row", f) for f in plan.final)
    ids: _Ids = {}
    total = len(batches)
    for done, batch in enumerate(batches, start=1):
        if lease_renew(name=lease, holder=holder, now=clock.now(), ttl=_LEASE_TTL) is None:
            raise LayoutError(
                [f"slug: lost the apply lease after {done - 1} of {total} batches; re-apply"],
                batches_written=done - 1,
            )
        try:
            _write_batch(batch, ids, plan, prune=done > first_prune)
        except LayoutError as exc:
            raise type(exc)(exc.errors, batches_written=done - 1) from None
        report.batches = done
        if on_batch is not None:
            on_batch(done, total)
        if done < total and pause_s:
            # A waiting writer must see the lock free: SQLite's busy wait polls with growing
            # sleeps (up to 100 ms), so back-to-back batches would starve a tick's heartbeat.
            time.sleep(pause_s)


def _write_batch(
    batch: list[tuple[str, Callable[[_Ids], Any]]], ids: _Ids, plan: _Plan, *, prune: bool
) -> None:
    with transaction.atomic():
        if plan.rollout_check is not None:
            plan.rollout_check()
        if prune and plan.prune_check is not None:
            plan.prune_check()
        new: list[ModelBinding] = []
        for kind, f in batch:
            if kind == "binding":
                new.append(f(ids))
            else:
                f(ids)
        ModelBinding.objects.bulk_create(new)


def _ships_tls(provider: str, driver: dict[str, Any]) -> bool:
    """Whether the domain's launches ship the TLS identity (and so provisioning owns its pin)."""
    if not driver or provider == Provider.STATIC or provider not in provider_names():
        return False
    return builtin().get(provider).ships_tls


def _refuse_supervisor_hosts(layout: Layout) -> None:
    """Refuse, before writing anything, a supervisor URL Haru would never call (credentials in
    it, or a host outside HARU_SUPERVISOR_HOSTS)."""
    patterns = haru_settings().supervisor_hosts
    errors = [
        f"domains[{i}].supervisorUrl: {problem}"
        for i, d in enumerate(layout.domains)
        if d.supervisor_url and (problem := supervisor_url_problem(d.supervisor_url, patterns))
    ]
    if errors:
        raise LayoutError(errors)


def _plan(
    layout: Layout, prune: bool, report: LayoutReport, actor: str, revert_rollout: bool = False
) -> _Plan:
    """Read what exists (a few queries, no transaction) and plan every write; fill `report`."""
    now = clock.now()
    plan = _Plan()
    existing = Fleet.objects.filter(slug=layout.slug).first()
    current = _plan_fleet(layout, existing, report, plan)
    serving_slug = _serving_slug(layout, existing, report)
    for di, d in enumerate(layout.domains):
        _plan_domain(layout, di, d, current, serving_slug, now, report, plan)
    plan.rows += current.slot_rows + current.binding_rows

    if existing is None and layout.active_domain_slug:
        plan.tail.append(_point_new_fleet(("domain", layout.active_domain_slug)))
    if existing is not None:
        _plan_rollouts(existing, current, report, plan, revert_rollout)
        _plan_extras(
            existing,
            current.kept_domains,
            current.kept_slots,
            current.kept_bindings,
            prune,
            report,
            plan,
        )
    plan.final.append(_applied(actor, report))
    return plan


@dataclass
class _Current:
    """The fleet's rows before the apply, and the plan's writes and keeps of them."""

    domains: dict[str, Domain] = field(default_factory=dict)
    slots: dict[tuple[Id, int, str], Slot] = field(default_factory=dict)
    bindings: dict[tuple[Id, str], ModelBinding] = field(default_factory=dict)
    kept_domains: set[Id] = field(default_factory=set)
    kept_slots: set[Id] = field(default_factory=set)
    kept_bindings: set[Id] = field(default_factory=set)
    slot_rows: list[Callable[[_Ids], None]] = field(default_factory=list)
    binding_rows: list[Callable[[_Ids], None]] = field(default_factory=list)
    # Existing models whose profile or serving URL the file changes: (label, row, new values).
    moved: list[tuple[str, ModelBinding, dict[str, Any]]] = field(default_factory=list)


def _plan_fleet(
    layout: Layout, existing: Fleet | None, report: LayoutReport, plan: _Plan
) -> _Current:
    """Plan the fleet row's write; return what the fleet holds now (nothing for a new one)."""
    if existing is None:
        report.created.append(f"fleet {layout.slug}")

        def create_fleet(ids: _Ids) -> None:
            ids[("fleet",)] = Fleet.objects.create(
                slug=layout.slug, display_name=layout.display_name, policy=layout.policy
            )

        plan.rows.append(create_fleet)
        return _Current()
    fleet = existing
    fvalues = {"display_name": layout.display_name, "policy": layout.policy}
    fchanged = _sync(fleet, fvalues, f"fleet {layout.slug}", report)

    def sync_fleet(ids: _Ids) -> None:
        if fchanged:
            _save(fleet, fvalues, fchanged)
        ids[("fleet",)] = fleet

    plan.rows.append(sync_fleet)
    return _Current(
        domains={d.slug: d for d in Domain.objects.filter(fleet=fleet)},
        slots={
            (s.domain_id, s.gpu_index, s.kind): s for s in Slot.objects.filter(domain__fleet=fleet)
        },
        bindings={
            (b.domain_id, b.name): b for b in ModelBinding.objects.filter(domain__fleet=fleet)
        },
    )


def _serving_slug(layout: Layout, existing: Fleet | None, report: LayoutReport) -> str | None:
    """The domain new inference slots start serving in: the live pointer's, or for a new fleet
    the declared active domain (the next heartbeats correct it from what supervisors report)."""
    if existing is None:
        return layout.active_domain_slug
    live_active_slug = (
        None
        if existing.active_domain_id is None
        else Domain.objects.get(pk=existing.active_domain_id).slug
    )
    if layout.active_domain_slug not in (None, live_active_slug):
        # Say so rather than stay silent: an operator editing the file may expect a switch.
        routes = f"routes to {live_active_slug!r}" if live_active_slug else "has no active domain"
        report.notes.append(
            f"activeDomainSlug {layout.active_domain_slug!r} is not applied: the fleet {routes} "
            f"(revision {existing.route_revision}); a layout never moves routing, promote "
            f"{layout.active_domain_slug!r} to switch"
        )
    return live_active_slug


def _plan_domain(
    layout: Layout,
    di: int,
    d: DomainSpec,
    current: _Current,
    serving_slug: str | None,
    now: datetime,
    report: LayoutReport,
    plan: _Plan,
) -> None:
    """Plan one domain's row, then its slots' and models' (`current` collects them)."""
    label = f"domain {layout.slug}/{d.slug}"
    values: dict[str, Any] = {
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
    # Likewise its pin, when its launch ships the certificate; else the layout says both.
    if not _ships_tls(d.provider, d.driver):
        values["supervisor_transport"] = d.supervisor_transport
        values["supervisor_fingerprint"] = d.supervisor_fingerprint
    domain = current.domains.get(d.slug)
    dkey: _Key = ("domain", d.slug)
    if domain is None:
        report.created.append(label)
        plan.rows.append(_domain_create(dkey, d.slug, values, now))
    else:
        plan.rows.append(_row_sync(dkey, domain, values, _sync(domain, values, label, report)))
        current.kept_domains.add(domain.id)

    for s in _keep_placements(d, domain, f"domains[{di}]", report):
        slabel = f"slot {layout.slug}/{d.slug}/gpu{s.gpu_index}/{s.kind}"
        placed = {
            "spec": s.spec,
            "gpu_indices": s.gpu_indices or [s.gpu_index],
            "mig_instance": s.mig_instance,
            "allocation": s.allocation,
        }
        slot = None if domain is None else current.slots.get((domain.id, s.gpu_index, s.kind))
        skey: _Key = ("slot", d.slug, s.gpu_index, s.kind)
        if slot is None:
            report.created.append(slabel)
            current.slot_rows.append(
                _slot_create(skey, dkey, s.gpu_index, s.kind, placed, d.slug == serving_slug, now)
            )
        else:
            current.slot_rows.append(
                _row_sync(skey, slot, placed, _sync(slot, placed, slabel, report))
            )
            current.kept_slots.add(slot.id)
        _plan_models(layout, d, s, domain, slot, skey, dkey, current, report, plan)


def _plan_models(
    layout: Layout,
    d: DomainSpec,
    s: SlotSpec,
    domain: Domain | None,
    slot: Slot | None,
    skey: _Key,
    dkey: _Key,
    current: _Current,
    report: LayoutReport,
    plan: _Plan,
) -> None:
    """Plan the model bindings of one slot: new ones in bulk, existing ones synced."""
    for m in s.models:
        mlabel = f"model {layout.slug}/{d.slug}/{m.name}"
        binding = None if domain is None else current.bindings.get((domain.id, m.name))
        bvalues: dict[str, Any] = {
            # A slot this apply creates has no id yet: None reads as changed, and the
            # write puts the new slot's id in.
            "slot_id": None if slot is None else slot.id,
            "serving_url": m.serving_url,
            "profile": m.profile,
            "memory": m.memory,
            "golden": m.golden,
        }
        if d.driver and not m.serving_url and binding is not None:
            del bvalues["serving_url"]  # set from the cluster at provisioning
        if binding is None:
            report.created.append(mlabel)
            del bvalues["slot_id"]
            plan.bindings.append(_binding_create(dkey, skey, m.name, bvalues))
        else:
            changed = _sync(binding, bvalues, mlabel, report)
            if {"profile", "serving_url"} & set(changed):
                current.moved.append((mlabel, binding, bvalues))
            current.binding_rows.append(_binding_sync(binding, bvalues, changed, skey))
            current.kept_bindings.add(binding.id)


def rollout_holding_layout(fleet_id: Id) -> Rollout | None:
    """The fleet's rollout in flight, which a layout change must wait for (None: none)."""
    return (
        Rollout.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_ROLLOUT_STATES)
        .only("id", "model", "state")
        .first()
    )


def layout_refused_by_rollout(rollout: Rollout) -> str:
    """Why a layout change is refused while `rollout` is in flight, and what to do."""
    return (
        f"rollout {rollout.id} of model {rollout.model!r} is in flight ({rollout.state}): "
        "a layout change to a domain, slot or model waits until it ends; pause does not "
        "release it, abort it or let it finish, then apply again"
    )


def _refuse_rollout_in_flight(fleet_id: Id) -> None:
    rollout = rollout_holding_layout(fleet_id)
    if rollout is not None:
        raise LayoutRolloutConflict([f"domains: {layout_refused_by_rollout(rollout)}"])


# Finished rollouts looked at for a model's origin, newest first: enough for years of weekly
# rollouts of every model of a fleet, and a bound on one apply's reads.
_ROLLOUTS_READ = 500


def _plan_rollouts(
    fleet: Fleet, current: _Current, report: LayoutReport, plan: _Plan, revert_rollout: bool
) -> None:
    """Refuse a change while a rollout is in flight, and a file behind a finished one."""
    changes = [
        e for e in report.created + report.updated if not e.startswith(f"fleet {fleet.slug}")
    ]
    if changes:
        _refuse_rollout_in_flight(fleet.id)
        # Checked again in every batch: a rollout may start between the plan and a write.
        plan.rollout_check = lambda: _refuse_rollout_in_flight(fleet.id)
    if not current.moved:
        return
    rollouts = list(
        Rollout.objects.filter(fleet=fleet, model__in={b.name for _, b, _ in current.moved})
        .exclude(state__in=IN_FLIGHT_ROLLOUT_STATES)
        .order_by("-created_at")[:_ROLLOUTS_READ]
    )
    errors: list[str] = []
    for label, binding, values in current.moved:
        found = _moved_by(binding, rollouts)
        if found is None:
            continue
        rollout, previous = found
        behind = [
            key
            for key, field_name in (("profile", "profile"), ("servingUrl", "serving_url"))
            if field_name in values
            and values[field_name] != getattr(binding, field_name)
            and values[field_name] == previous.get(key)
        ]
        if not behind:
            continue  # the file names a third version on purpose: an ordinary edit
        if revert_rollout:
            report.notes.append(
                f"{label}: rollout {rollout.id} moved it; its database record is reverted to the "
                f"file's {' and '.join(behind)} (revert_rollout); the hosts are not changed and "
                "still serve the rollout's version until a new rollout or an operator swaps it"
            )
            continue
        errors.append(_behind_message(label, binding, rollout, behind))
    if errors:
        raise LayoutBehindRollout(errors)


def _moved_by(
    binding: ModelBinding, rollouts: list[Rollout]
) -> tuple[Rollout, dict[str, Any]] | None:
    """The newest finished rollout that put this model's current profile on this domain, with
    what the model had there before it; None when its current profile came from elsewhere."""
    for rollout in rollouts:
        if rollout.model != binding.name:
            continue
        previous = (rollout.previous or {}).get(str(binding.domain_id))
        profile = (rollout.candidate or {}).get("profile")
        if (
            isinstance(previous, dict)
            and profile == binding.profile
            and previous.get("profile") != binding.profile
        ):
            return rollout, previous
    return None


def _behind_message(label: str, binding: ModelBinding, rollout: Rollout, behind: list[str]) -> str:
    # Names the fields and the profile's keys, never its values: a profile may hold an engine's
    # settings an operator would not want in an error (the admin's export has them in full).
    old = (rollout.previous or {}).get(str(binding.domain_id), {}).get("profile") or {}
    now = binding.profile or {}
    keys = sorted(k for k in set(now) | set(old) if now.get(k) != old.get(k))[:8]
    return (
        f"{label}: the layout file is behind rollout {rollout.id} ({rollout.state}), which moved "
        f"it to the version its host serves; the file names the old {' and '.join(behind)}. "
        f'Set its "profile" to the rollout\'s (differing keys: {", ".join(keys) or "none"}) '
        f'and "servingUrl" to {without_userinfo(binding.serving_url)!r} (the admin\'s '
        "export has both), or apply with --revert-rollout to revert only the database record"
    )


def _point_new_fleet(active_key: _Key) -> Callable[[_Ids], None]:
    def point(ids: _Ids) -> None:
        # Setting the pointer of a fleet this apply created; revision stays 1.
        Fleet.objects.filter(pk=ids[("fleet",)].pk, active_domain__isnull=True).update(
            active_domain=ids[active_key]
        )

    return point


def _applied(actor: str, report: LayoutReport) -> Callable[[_Ids], None]:
    def applied(ids: _Ids) -> None:
        event_record(
            fleet_id=ids[("fleet",)].id,
            kind="layout.applied",
            actor=actor,
            data={
                "created": len(report.created),
                "updated": len(report.updated),
                "extra": len(report.extra),
                "pruned": len(report.pruned),
            },
        )

    return applied


def _domain_create(
    key: _Key, slug: str, values: dict[str, Any], now: datetime
) -> Callable[[_Ids], None]:
    def write(ids: _Ids) -> None:
        ids[key] = domain_add(domain=Domain(fleet=ids[("fleet",)], slug=slug, **values), now=now)

    return write


def _slot_create(
    key: _Key,
    dkey: _Key,
    gpu_index: int,
    kind: str,
    placed: dict[str, Any],
    on_active: bool,
    now: datetime,
) -> Callable[[_Ids], None]:
    def write(ids: _Ids) -> None:
        ids[key] = slot_add(
            slot=Slot(domain=ids[dkey], gpu_index=gpu_index, kind=kind, **placed),
            on_active=on_active,
            now=now,
        )

    return write


def _row_sync(
    key: _Key, obj: Model, values: dict[str, Any], changed: list[str]
) -> Callable[[_Ids], None]:
    def write(ids: _Ids) -> None:
        if changed:
            _save(obj, values, changed)
        ids[key] = obj

    return write


def _binding_create(
    dkey: _Key, skey: _Key, name: str, values: dict[str, Any]
) -> Callable[[_Ids], ModelBinding]:
    def build(ids: _Ids) -> ModelBinding:
        return ModelBinding(domain=ids[dkey], slot=ids[skey], name=name, **values)

    return build


def _binding_sync(
    binding: ModelBinding, values: dict[str, Any], changed: list[str], skey: _Key
) -> Callable[[_Ids], None]:
    def write(ids: _Ids) -> None:
        if "slot_id" in changed:
            values["slot_id"] = ids[skey].id
        if changed:
            _save(binding, values, changed)

    return write


def _keep_placements(
    d: DomainSpec, domain: Domain | None, dpath: str, report: LayoutReport
) -> list[SlotSpec]:
    """Re-plan a planned domain that already runs with its slots kept where they are.

    Planning from scratch could move a running server to another GPU just because a new slot
    was added. Units the layout does not pin are pinned to the GPU their models (or, for a
    trainer, its checkpoint dir) are on now; when that no longer fits, the fresh plan stands
    and the report says so.
    """
    if not d.gpu_layout or not d.unplanned or domain is None:
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


def _plan_extras(
    fleet: Fleet,
    kept_domains: set[Id],
    kept_slots: set[Id],
    kept_bindings: set[Id],
    prune: bool,
    report: LayoutReport,
    plan: _Plan,
) -> None:
    """Report what the database has and the file does not; with prune, plan deleting it."""
    extra_bindings = list(
        ModelBinding.objects.filter(domain__fleet=fleet)
        .exclude(id__in=kept_bindings)
        .select_related("domain")
    )
    extra_slots = list(
        Slot.objects.filter(domain__fleet=fleet).exclude(id__in=kept_slots).select_related("domain")
    )
    extra_domains = list(Domain.objects.filter(fleet=fleet).exclude(id__in=kept_domains))
    for b in extra_bindings:
        report.extra.append(f"model {fleet.slug}/{b.domain.slug}/{b.name}")
    for s in extra_slots:
        report.extra.append(f"slot {fleet.slug}/{s.domain.slug}/gpu{s.gpu_index}/{s.kind}")
    for d in extra_domains:
        report.extra.append(f"domain {fleet.slug}/{d.slug}")
    if not prune:
        return
    _refuse_prune(fleet, {d.id for d in extra_domains})
    report.pruned = list(report.extra)
    # Models, then slots, then domains: a row never outlives what it points at being deleted
    # first (the cascade would do it, but one batch would then hold all of a domain's rows).
    for model, rows in (
        (ModelBinding, extra_bindings),
        (Slot, extra_slots),
        (Domain, extra_domains),
    ):
        plan.prune += [_delete(model, row.pk) for row in rows]
    domain_ids: set[Id] = {d.id for d in extra_domains}
    # Checked again at the start of every prune batch, in its transaction: an operation may
    # have started, or routing moved onto a domain being pruned, since the plan was made.
    plan.prune_check = lambda: _refuse_prune(fleet, domain_ids)


def _refuse_prune(fleet: Fleet, domain_ids: set[Id]) -> None:
    """Refuse pruning the active domain, or anything while an operation or a rollout is in
    flight."""
    active_id = Fleet.objects.filter(pk=fleet.pk).values_list("active_domain_id", flat=True).get()
    blocked = Domain.objects.filter(pk=active_id, id__in=domain_ids).values_list("slug", flat=True)
    if blocked:
        raise LayoutError(
            [
                f"domains: cannot prune {blocked[0]!r}: it is the active domain; "
                f"promote another domain first"
            ]
        )
    if Operation.objects.filter(fleet=fleet, state__in=IN_FLIGHT_OPERATION_STATES).exists():
        raise LayoutError(["domains: cannot prune while an operation is in flight"])
    if Rollout.objects.filter(fleet=fleet, state__in=IN_FLIGHT_ROLLOUT_STATES).exists():
        raise LayoutError(["domains: cannot prune while a rollout is in flight"])


def _delete(model: type[Model], pk: Id) -> Callable[[_Ids], None]:
    def write(ids: _Ids) -> None:
        model._default_manager.filter(pk=pk).delete()

    return write


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
        if not _ships_tls(d.provider, d.driver):
            if d.supervisor_transport != TLS:
                dd["supervisorTransport"] = d.supervisor_transport
            if d.supervisor_fingerprint:
                dd["supervisorFingerprint"] = d.supervisor_fingerprint
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
