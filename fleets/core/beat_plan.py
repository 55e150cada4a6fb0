"""One heartbeat, decided at once: every write it owes, as a plan.

The reconciler asks a supervisor (and, where it cannot vouch, the model servers) and reads the
rows the beat may move; `beat_plan` decides, from those alone, every move: each bound slot's
state (`fleets.core.mirror`), the trainer's PIDs, the domain's state, each model server's
health (`fleets.core.model_health`) and engine version, and what the domain row records (the
report with its GPU memory, `last_seen_at`, or the failure). `fleets.services.heartbeats`
writes the plan in one call, each row behind the same guard as before: the state it was
planned from, and "unchanged since the report was taken".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from fleets.core.mirror import (
    ModelPosture,
    TrainerPosture,
    domain_move,
    inference_move,
    training_move,
)
from fleets.core.model_health import Reach, ServerHealth, model_health
from fleets.core.report import (
    INFERENCE,
    TRAINING,
    DomainReport,
    GpuMemory,
    ReadError,
    StatusReport,
    TrainerReportState,
    TrainingReport,
)
from fleets.core.states import TrainingState

# -- what the beat read --------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotRow:
    """A slot as read before the beat is applied."""

    id: Any
    kind: str
    state: str
    gpu_index: int
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class BindingRow:
    """A model binding as read before the beat is applied."""

    id: Any
    slot_id: Any
    name: str
    health: str
    engine_version: str


@dataclass(frozen=True)
class GpuAnswer:
    """A GPU memory read that came in with this beat: when it was asked, and its answer."""

    asked_at: datetime
    memory: GpuMemory | None = None
    error: ReadError | None = None
    unavailable: bool = False  # a 501: the host has no GPU facts (an answer, not a failure)


@dataclass(frozen=True)
class Heard:
    """What one beat heard: the supervisor's status (or why not), the model servers asked
    directly, and the GPU memory answer if one came in."""

    observed_at: datetime
    status: StatusReport | None
    error: ReadError | None = None
    direct: Mapping[str, Reach] = field(default_factory=dict)
    gpu: GpuAnswer | None = None


# -- what the beat writes ------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotMove:
    slot_id: Any
    from_state: str
    to_state: str
    reason: str
    pids: list[int] | None = None  # a training slot's PIDs, written with the move


@dataclass(frozen=True)
class PidsRecord:
    slot_id: Any
    pids: list[int]


@dataclass(frozen=True)
class DomainMove:
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True)
class HealthRecord:
    binding_id: Any
    health: ServerHealth
    source: str  # who told: "supervisor" or "direct"


@dataclass(frozen=True)
class VersionRecord:
    binding_id: Any
    engine_version: str


@dataclass(frozen=True)
class BeatPlan:
    """Every write of one beat, in the order they are made: slots, then the domain, then the
    model servers, then the domain row's record (`last_seen_at` moves only after the slots)."""

    domain_id: Any
    fleet_id: Any
    observed_at: datetime
    now: datetime  # the moves' `state_updated_at`
    slots: tuple[SlotMove, ...] = ()
    pids: tuple[PidsRecord, ...] = ()
    domain: DomainMove | None = None
    health: tuple[HealthRecord, ...] = ()
    versions: tuple[VersionRecord, ...] = ()
    # Recorded as seen (the report to store, and when its GPU answer was asked, if any) ...
    seen: DomainReport | None = None
    gpus_read_at: datetime | None = None
    # ... or as failed (why).
    failed: ReadError | None = None


# -- the rules -----------------------------------------------------------------------------------


def model_posture(report: StatusReport | None, name: str) -> ModelPosture:
    reading = report.model(name) if report is not None else None
    if reading is None:
        return ModelPosture.MISSING
    if reading.sleeping is None:
        return ModelPosture.UNKNOWN
    return ModelPosture.ASLEEP if reading.sleeping else ModelPosture.AWAKE


def trainer_posture(reading: TrainingReport | None) -> TrainerPosture:
    if reading is None:
        return TrainerPosture.ABSENT
    if reading.running_with_pid:
        return TrainerPosture.RUNNING
    return TrainerPosture.IDLE if reading.state == TrainerReportState.IDLE else TrainerPosture.OTHER


def _inference_slot(
    slot: SlotRow,
    names: list[str],
    report: StatusReport | None,
    *,
    is_active: bool,
    settle_serving: bool,
) -> tuple[SlotMove | None, bool]:
    """One inference slot's move, and whether its models are in the role's posture."""
    postures = [model_posture(report, n) for n in names]
    result = inference_move(
        slot.state,
        postures,
        reachable=report is not None,
        is_active=is_active,
        settle_serving=settle_serving,
    )
    if result.to_state is None:
        return None, result.in_posture
    missing = [n for n, p in zip(names, postures, strict=True) if p == ModelPosture.MISSING]
    if report is None:
        reason = "supervisor unreachable"
    else:
        reason = f"missing from status: {', '.join(missing)}" if missing else "reported posture"
    return SlotMove(slot.id, slot.state, result.to_state, reason), result.in_posture


def _training_slot(slot: SlotRow, report: StatusReport) -> SlotMove | PidsRecord | None:
    reading = report.training(slot.gpu_index)
    posture = trainer_posture(reading)
    pids = list(reading.pids) if reading is not None else []
    to_state = training_move(slot.state, posture)
    if to_state is not None:
        training = to_state == TrainingState.TRAINING
        reason = "trainer running" if training else "trainer not running"
        return SlotMove(slot.id, slot.state, to_state, reason, pids if training else [])
    if (
        slot.state == TrainingState.TRAINING
        and posture == TrainerPosture.RUNNING
        and pids != list(slot.pids)
    ):
        return PidsRecord(slot.id, pids)
    return None


def _domain(
    state: str, report: StatusReport | None, *, is_active: bool, healthy: bool
) -> DomainMove | None:
    to_state = domain_move(
        state, reachable=report is not None, is_active=is_active, in_posture=healthy
    )
    if to_state is None:
        return None
    if report is None:
        reason = "heartbeat failed"
    elif healthy:
        reason = "heartbeat healthy"
    else:
        reason = "not every bound model is awake" if is_active else "model state unknown"
    return DomainMove(state, to_state, reason)


def _health(binding: BindingRow, heard: Heard) -> HealthRecord | None:
    """A model server's health from this beat: written when it changes, and on every direct
    sighting of a live server (what keeps a supervisor-less active from reading stale)."""
    direct = heard.direct.get(binding.name, Reach.NOT_ASKED)
    health = model_health(
        supervisor_answered=heard.status is not None,
        posture=model_posture(heard.status, binding.name),
        direct=direct,
    )
    if health is None or (health == binding.health and direct == Reach.NOT_ASKED):
        return None
    if health == binding.health and health != ServerHealth.UP:
        return None
    return HealthRecord(binding.id, health, "direct" if direct != Reach.NOT_ASKED else "supervisor")


def _version(binding: BindingRow, report: StatusReport | None) -> VersionRecord | None:
    """An engine version as the supervisor reported it (ours reports it; the original does
    not, and an unreported version changes nothing)."""
    reading = report.model(binding.name) if report is not None else None
    version = reading.engine_version if reading is not None else None
    if version and version != binding.engine_version:
        return VersionRecord(binding.id, version)
    return None


def gpu_keys(
    previous: DomainReport, answer: GpuAnswer | None
) -> tuple[tuple[Any, ...], datetime | None, ReadError | None]:
    """The GPU memory to store with a report: this beat's answer, else the previous one.

    A 501 (no GPU facts on that host) drops the bars; any other failure keeps the previous
    bars and their time and says why.
    """
    if answer is None:
        return previous.gpus, previous.gpus_at, previous.gpus_error
    if answer.memory is not None:
        return answer.memory.gpus, answer.asked_at, None
    error = replace(answer.error or ReadError("unknown", ""), at=answer.asked_at)
    if answer.unavailable:
        return (), answer.asked_at, error
    return previous.gpus, previous.gpus_at, error


def beat_plan(
    *,
    domain_id: Any,
    fleet_id: Any,
    domain_state: str,
    stored: DomainReport,
    slots: Sequence[SlotRow],
    bindings: Sequence[BindingRow],
    heard: Heard,
    is_active: bool,
    settle_serving: bool,
    now: datetime,
) -> BeatPlan:
    """Decide every write of one beat of one domain.

    `stored`: the domain's report as read before the beat (its GPU memory is carried over when
    this beat brought none); `settle_serving`: no operation is in flight, so a standby left
    serving settles to what it is.
    """
    report = heard.status
    names: dict[Any, list[str]] = {}
    for b in bindings:
        names.setdefault(b.slot_id, []).append(b.name)
    moves: list[SlotMove] = []
    pids: list[PidsRecord] = []
    healthy = True
    for slot in slots:
        if slot.kind == INFERENCE and slot.id in names:
            move, in_posture = _inference_slot(
                slot, names[slot.id], report, is_active=is_active, settle_serving=settle_serving
            )
            healthy = healthy and in_posture
            moves += [move] if move is not None else []
        elif slot.kind == TRAINING and report is not None:
            found = _training_slot(slot, report)
            if isinstance(found, SlotMove):
                moves.append(found)
            elif found is not None:
                pids.append(found)
    plan = BeatPlan(
        domain_id=domain_id,
        fleet_id=fleet_id,
        observed_at=heard.observed_at,
        now=now,
        slots=tuple(moves),
        pids=tuple(pids),
        domain=_domain(domain_state, report, is_active=is_active, healthy=healthy),
        health=tuple(h for h in (_health(b, heard) for b in bindings) if h is not None),
        versions=tuple(v for v in (_version(b, report) for b in bindings) if v is not None),
    )
    if report is None:
        return replace(plan, failed=heard.error)
    gpus, gpus_at, gpus_error = gpu_keys(stored, heard.gpu)
    seen = DomainReport(status=report, gpus=gpus, gpus_at=gpus_at, gpus_error=gpus_error)
    return replace(
        plan, seen=seen, gpus_read_at=heard.gpu.asked_at if heard.gpu is not None else None
    )
