"""Gather what the readiness verdict needs from the database, then ask the core.

Reads only: heartbeat reports, the layout's plan, baselines and the last drill. The verdict's
rules are fleets.core.readiness's.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from common.adapter_manifest import engine_name
from common.strict_json import is_number
from common.wire.shape import FEATURE_PROBE_GOLDEN
from fleets.base import clock
from fleets.core.adapter_route import AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import STORED_STATES
from fleets.core.golden import (
    baseline_missing,
    profile_fingerprint,
    request_fingerprint,
    target_label,
)
from fleets.core.policy import Policy
from fleets.core.read_model import FleetView
from fleets.core.readiness import (
    DrillFacts,
    GpuFacts,
    Readiness,
    StandbyFacts,
    TrainerFacts,
    failover_readiness,
    pick_standby,
)
from fleets.core.report import DomainReport, read_report
from fleets.core.states import InferenceState, OperationKind, OperationState, SlotKind
from fleets.models import (
    AdapterCopy,
    Domain,
    Fleet,
    GoldenBaseline,
    Id,
    ModelBinding,
    Operation,
    Slot,
)
from fleets.reads.selectors import fleet_view


def _number(value: object) -> float | None:
    return float(value) if is_number(value) else None


def _gpus(report: DomainReport) -> tuple[GpuFacts, ...]:
    return tuple(
        GpuFacts(g.index, g.used_mib, g.total_mib)
        for g in report.gpus
        if g.used_mib is not None and g.total_mib is not None
    )


def _wake_mib(slots: list[Slot], bound_slot_ids: Collection[object]) -> dict[int, float] | None:
    """MiB each GPU must have free for the wake: the plan's need less the sleep residue."""
    need: dict[int, float] = {}
    for slot in slots:
        if slot.kind != SlotKind.INFERENCE or slot.id not in bound_slot_ids:
            continue
        if slot.state == InferenceState.SERVING:
            # Already awake (a rollout's candidate on the standby): its wake restores nothing,
            # and the memory it holds is not memory a failover still has to find.
            continue
        servers = (slot.allocation or {}).get("servers")
        if not isinstance(servers, dict) or not servers:
            return None  # planned by hand: the need is not known
        per_gpu = sum(
            max(0.0, (_number(s.get("needMiB")) or 0.0) - (_number(s.get("sleepResidueMiB")) or 0))
            for s in servers.values()
            if isinstance(s, dict)
        )
        for index in slot.gpu_indices or [slot.gpu_index]:
            need[index] = need.get(index, 0.0) + per_gpu
    return need


# The columns of a baseline the verdict reads, in the order `_baselines` unpacks them.
BASELINE_COLUMNS = (
    "model_name",
    "adapter",
    "profile_fingerprint",
    "engine_version",
    "recorded_at",
)


def _baselines(
    domain: Domain,
    policy: Policy,
    baselines: list[tuple] | None = None,
    bindings: list[ModelBinding] | None = None,
) -> tuple[tuple[str, ...], datetime | None]:
    """The standby's targets with no baseline to be judged against (at the engine version its
    servers last reported), and when the oldest baseline its targets do have was recorded.

    `baselines` (the fleet's rows: request fingerprint first, then `BASELINE_COLUMNS`) and
    `bindings` (the domain's) when already read for many fleets at once."""
    request = request_fingerprint(policy.probe_prompt, policy.probe_max_tokens)
    if baselines is None:
        rows = list(
            GoldenBaseline.objects.filter(
                fleet_id=domain.fleet_id, request_fingerprint=request
            ).values_list(*BASELINE_COLUMNS)
        )
    else:
        rows = [row[1:] for row in baselines if row[0] == request]
    if bindings is None:
        bindings = list(ModelBinding.objects.filter(domain=domain))
    recorded = {row[:4] for row in rows}
    missing, used = [], []
    for b in sorted(bindings, key=lambda b: b.name):
        if b.golden.get("deterministic", True) is False:
            continue
        profile = profile_fingerprint(b.profile)
        for adapter in ("", *b.golden.get("adapters", ())):
            if baseline_missing(
                recorded,
                model=b.name,
                adapter=adapter,
                profile=b.profile,
                engine_version=b.engine_version,
            ):
                label = target_label(b.name, adapter)
                missing.append(
                    f"{label} on engine {b.engine_version}" if b.engine_version else label
                )
                continue
            version = b.engine_version  # "": not reported, a baseline at any version counts
            used += [
                at
                for row_model, row_adapter, row_profile, row_version, at in rows
                if (row_model, row_adapter, row_profile) == (b.name, adapter, profile)
                and (not version or row_version == version)
            ]
    return tuple(missing), min(used, default=None)


def standby_facts(
    domain: Domain,
    policy: Policy,
    *,
    slots: list[Slot] | None = None,
    bindings: list[ModelBinding] | None = None,
    baselines: list[tuple] | None = None,
    adapter_routes: Any = None,
) -> StandbyFacts:
    """What the verdict needs of the standby; `slots`, `bindings` (the domain's) and
    `baselines` (see `_baselines`) when already read for many fleets at once; with the
    fleet's `adapter_routes` (as stored), whether it holds every routed adapter version."""
    if bindings is None:
        bindings = list(ModelBinding.objects.filter(domain=domain))
    missing, baselines_at = _baselines(domain, policy, baselines, bindings)
    if slots is None:
        slots = list(Slot.objects.filter(domain=domain))
    bound = {b.slot_id for b in bindings}
    report = read_report(domain.last_report)
    reported = report.trainings()
    trainers = []
    for slot in slots:
        if slot.kind != SlotKind.TRAINING:
            continue
        seen = reported.get(slot.gpu_index)
        trainers.append(
            TrainerFacts(
                slot.gpu_index,
                (seen.state or "unknown") if seen else "unknown",
                seen.checkpoint_at if seen else None,
            )
        )
    # What its supervisor can prove, from the features its last status listed (unknown until
    # one arrives: then nothing is said). Haru's supervisor lists features and reports each
    # trainer's newest checkpoint; the original lists none and reports none.
    features = report.status.features if report.status is not None else None
    return StandbyFacts(
        gpus=_gpus(report),
        gpus_read_at=domain.gpus_read_at,
        wake_mib=_wake_mib(slots, bound),
        trainers=tuple(trainers),
        missing_baselines=missing,
        baselines_at=baselines_at,
        golden_probes=features is None or FEATURE_PROBE_GOLDEN in features,
        checkpoint_times=features is None or bool(features),
        **_adapters(domain, adapter_routes),
    )


def _adapters(domain: Domain, stored_routes: Any) -> dict[str, tuple[str, ...]]:
    """The routed adapter versions, and those the domain holds no stored copy of (one read,
    only for a fleet with adapter routes)."""
    try:
        routes = adapter_routes_parse(stored_routes)
    except AdapterRouteInvalid:
        routes = {}
    routed = sorted((name, v) for name, r in routes.items() for v in r.versions())
    if not routed:
        return {}
    held = set(
        AdapterCopy.objects.filter(
            domain=domain,
            adapter__name__in={n for n, _ in routed},
            state__in=[s.value for s in STORED_STATES],
        ).values_list("adapter__name", "adapter__version")
    )
    return {
        "routed_adapters": tuple(engine_name(n, v) for n, v in routed),
        "missing_adapters": tuple(engine_name(n, v) for n, v in routed if (n, v) not in held),
    }


def finished_drills() -> QuerySet[Operation]:
    """Every finished drill, newest first (the last one is what the verdict judges)."""
    return Operation.objects.filter(
        kind=OperationKind.DRILL,
        state__in=[OperationState.SUCCEEDED, OperationState.FAILED],
        finished_at__isnull=False,
    ).order_by("-finished_at")


def last_drill(fleet_id: Id) -> DrillFacts | None:
    return drill_facts(finished_drills().filter(fleet_id=fleet_id).first())


def drill_facts(op: Any) -> DrillFacts | None:
    """The verdict's facts of a finished drill (an Operation, or a row with its `state`,
    `finished_at` and `error`; None: no drill yet)."""
    if op is None or op.finished_at is None:
        return None
    error = op.error or {}
    message = f"{error.get('code', '')}: {error.get('message', '')}" if error else ""
    return DrillFacts(op.finished_at, op.state == OperationState.SUCCEEDED, message[:300])


def fleet_readiness(
    fleet: Fleet, view: FleetView | None = None, now: datetime | None = None
) -> Readiness:
    """The fleet's failover readiness now."""
    view = view or fleet_view(fleet)
    now = now or clock.now()
    standby = pick_standby(view, now)
    facts = {}
    if standby is not None:
        domain = Domain.objects.get(pk=standby.id)
        facts[standby.id] = standby_facts(domain, view.policy, adapter_routes=fleet.adapter_routes)
    return failover_readiness(view, facts, last_drill(fleet.id), now)
