"""Gather recovery samples (fleets.core.recovery) from the operations and their step events."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber

from fleets.core.outage import failover_ms
from fleets.core.policy import Policy
from fleets.core.recovery import (
    RECOVERY_WINDOW,
    RecoveryKind,
    RecoverySample,
    RecoverySummary,
    detection_of,
    over_objective,
    sample,
    summarize,
)
from fleets.core.states import DomainState, OperationKind, OperationState
from fleets.models import Event, Fleet, Operation

# The promotions that are real failovers (fleets.core.outage.during_outage, with the old
# active's state as it was when the promotion was requested): automatic ones, and an
# operator's promotion away from a failed active (a fleet run with autoFailover off).
_REAL_FAILOVER = (
    Q(reason="auto_failover") | Q(detected_at__isnull=False) | Q(source_state=DomainState.FAILED)
)


# What an operation's failover figure is read from: the columns a query loads for it, and the
# arguments of fleets.core.outage.failover_ms, which has the same names.
_FIGURE_FIELDS = ("kind", "source_state", "detected_at", "source_seen_at", "served_at")


def operation_failover_ms(op: Any) -> int | None:
    """The operation's failover figure (fleets/core/outage.py: from the outage's start to the
    routing commit); None for one that answered no outage or has not moved routing. `op`: an
    Operation, or a row with its `_FIGURE_FIELDS`."""
    return failover_ms(**{name: getattr(op, name) for name in _FIGURE_FIELDS})


def recovery_samples(fleet: Fleet, window: int = RECOVERY_WINDOW) -> list[RecoverySample]:
    """The newest `window` successful drills and real failovers of the fleet, as samples.

    A real failover is an automatic one or an operator's promotion away from a failed active;
    its total is its figure (fleets/core/outage.py: outage start to routing commit), its
    detection measured from the outage's start to the promotion's start.
    """
    return recovery_samples_of([fleet], window).get(fleet.pk, [])


def recovery_samples_of(
    fleets: list[Fleet],
    window: int = RECOVERY_WINDOW,
    policies: dict[Any, Policy] | None = None,
) -> dict[Any, list[RecoverySample]]:
    """`recovery_samples` of each of `fleets`, in four queries whatever their number: the
    newest `window` per fleet are picked by the database (a window function), not by reading
    every operation a long history holds. `policies`: each fleet's, already resolved."""
    bounds = {
        f.pk: (policies[f.pk] if policies else Policy.resolve(f.policy)).heartbeat_stale_ms
        for f in fleets
    }
    out: dict[Any, list[RecoverySample]] = {f.pk: [] for f in fleets}
    if not fleets:
        return out
    for kind, name, which in (
        (OperationKind.DRILL, RecoveryKind.DRILL, Q()),
        (OperationKind.PROMOTE, RecoveryKind.FAILOVER, _REAL_FAILOVER),
    ):
        newest = Window(RowNumber(), partition_by=[F("fleet_id")], order_by=F("finished_at").desc())
        ops = list(
            Operation.objects.filter(
                which,
                fleet_id__in=list(bounds),
                kind=kind,
                state=OperationState.SUCCEEDED,
                finished_at__isnull=False,
            )
            .annotate(rank=newest)
            .filter(rank__lte=window)
            .order_by("fleet_id", "-finished_at")
            # Named tuples, not instances: 20 operations of each of 1,000 fleets in a scrape.
            .values_list("id", "fleet_id", *_FIGURE_FIELDS, "finished_at", "started_at", named=True)
        )
        steps: dict[object, dict[str, int]] = {op.id: {} for op in ops}
        rows = Event.objects.filter(
            operation_id__in=list(steps), kind="operation.step.done", duration_ms__isnull=False
        ).values_list("operation_id", "step", "duration_ms")
        for op_id, step, ms in rows:
            if ms is not None:
                steps[op_id][step] = ms
        for op in ops:
            if op.finished_at is None:
                continue
            detection_ms, how = detection_of(
                name,
                started_at=op.started_at,
                detected_at=op.detected_at,
                source_seen_at=op.source_seen_at,
                bound_ms=bounds[op.fleet_id],
            )
            figure = operation_failover_ms(op)
            s = sample(name, op.finished_at, steps[op.id], detection_ms, how, figure)
            if s is not None:
                out[op.fleet_id].append(s)
    return out


def recovery_summaries(fleet: Fleet) -> dict[str, RecoverySummary]:
    return summaries(recovery_samples(fleet))


def summaries(samples: list[RecoverySample]) -> dict[str, RecoverySummary]:
    """p50/p95 of a fleet's samples, per kind."""
    return {kind.value: summarize(kind, samples) for kind in RecoveryKind}


def recovery_report(fleet: Fleet) -> dict[str, Any]:
    """The published recovery time (`RecoveryOut`): p50/p95 per kind against the objective,
    and every sample's detection, steps and total, newest first."""
    rto = Policy.resolve(fleet.policy).rto_ms
    samples = recovery_samples(fleet)
    summaries = {kind.value: summarize(kind, samples) for kind in RecoveryKind}
    return {
        "objectiveMs": rto,
        "window": RECOVERY_WINDOW,
        "overObjective": any(over_objective(x, rto) for x in summaries.values()),
        **{kind: x.to_json() for kind, x in summaries.items()},
        "samples": [
            x.to_json() for x in sorted(samples, key=lambda x: x.finished_at, reverse=True)
        ],
    }
