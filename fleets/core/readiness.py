"""Can we fail over right now? One verdict, and every reason behind it with its age.

`not_ready`: a failover now would fail (no viable standby, or the memory its wake needs is
taken). `at_risk`: it would probably work, but something that proves it is missing or stale
(models awake on the standby, no golden baseline, a trainer that stopped checkpointing, no
recent passing drill, facts not known). `ready`: every check passed, on facts this fresh, or
its missing proof is accepted by the fleet's policy (`readiness.acceptMissing`: an original
supervisor never brings golden baselines or checkpoint times, so without it such a fleet
would read `at_risk` forever).

Pure: the caller gathers the facts (fleets/reads/readiness.py) and supplies the clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from fleets.core.failover import is_stale, is_viable_standby, rank_standbys
from fleets.core.read_model import DomainView, FleetView
from fleets.core.report import TrainerReportState
from fleets.core.states import DomainState, InferenceState, SlotKind
from fleets.core.timestamps import utc_iso


class ReadinessVerdict(StrEnum):
    READY = "ready"
    AT_RISK = "at_risk"
    NOT_READY = "not_ready"


class ReadinessCheck(StrEnum):
    """The checks behind a verdict, in the order the fleet page lists them."""

    STANDBY = "standby"
    MODELS_ASLEEP = "modelsAsleep"
    BASELINES = "baselines"
    WAKE_MEMORY = "wakeMemory"
    TRAINER = "trainer"
    DRILL = "drill"
    # Listed only for a fleet whose adapter routes name a version (docs/adapters.md).
    ADAPTERS = "adapters"


# A failed check of these means a failover now would fail; of the others, that it is unproven.
_BLOCKING = frozenset({ReadinessCheck.STANDBY, ReadinessCheck.WAKE_MEMORY})
# Where an operator who cannot bring a proof accepts its absence (policy key).
ACCEPT_KEY = "readiness.acceptMissing"


@dataclass(frozen=True)
class GpuFacts:
    index: int
    used_mib: float
    total_mib: float


@dataclass(frozen=True)
class TrainerFacts:
    gpu_index: int
    state: str  # the supervisor's (TrainerReportState); "unknown" when not reported
    last_checkpoint_at: datetime | None


@dataclass(frozen=True)
class StandbyFacts:
    """What the database knows of one standby beyond its DomainView."""

    gpus: tuple[GpuFacts, ...] = ()
    gpus_read_at: datetime | None = None
    # GPU index -> MiB its wake restores (the plan's need less the sleep residue); empty when
    # the layout plans no memory, so the need is unknown.
    wake_mib: Mapping[int, float] | None = None
    trainers: tuple[TrainerFacts, ...] = ()
    missing_baselines: tuple[str, ...] = ()
    # When the oldest baseline the standby's models are judged against was recorded (None:
    # none recorded); the age of the proof when nothing is missing.
    baselines_at: datetime | None = None
    # What its supervisor can prove. The original Haru supervisor runs no golden probes and
    # reports no checkpoint times: those proofs never come from it, and the reasons say so.
    golden_probes: bool = True
    checkpoint_times: bool = True
    # The adapter versions the fleet's routes name (engine names, `name@vN`), and those of them
    # the standby does not hold stored: a failover there would fail its adapter probe.
    routed_adapters: tuple[str, ...] = ()
    missing_adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class DrillFacts:
    finished_at: datetime
    passed: bool
    message: str = ""


@dataclass(frozen=True)
class Reason:
    check: ReadinessCheck
    ok: bool | None  # None: not known
    message: str
    # When the fact was observed; None only for a fact never observed at all (a standby that
    # never answered a heartbeat, no drill yet, no standby).
    at: datetime | None = None
    # Not proven, and the fleet's policy accepts that (`readiness.acceptMissing`): the verdict
    # does not count it as a risk; `ok` and the message still say what the fact is.
    accepted: bool = False

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            "check": self.check,
            "ok": self.ok,
            "accepted": self.accepted,
            "message": self.message,
            "at": utc_iso(self.at) if self.at else None,
            "ageMs": _age_ms(self.at, now) if self.at else None,
        }

    @property
    def counts_as_proven(self) -> bool:
        return self.ok is True or self.accepted


@dataclass(frozen=True)
class Readiness:
    verdict: ReadinessVerdict
    standby: str | None  # the slug of the standby a failover would take
    reasons: tuple[Reason, ...]
    evaluated_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "standby": self.standby,
            "evaluatedAt": utc_iso(self.evaluated_at),
            "reasons": [r.to_json(self.evaluated_at) for r in self.reasons],
        }


def _age_ms(at: datetime, now: datetime) -> int:
    return max(0, int((now - at).total_seconds() * 1000))


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.0f} s" if ms < 120_000 else f"{ms / 60_000:.0f} min"


def pick_standby(fleet: FleetView, now: datetime) -> DomainView | None:
    """The standby a failover would take now: the first viable one in failover order, else
    the first ranked one (so its reasons say what is wrong with it)."""
    ranked = rank_standbys(fleet, now)
    viable = next((d for d in ranked if is_viable_standby(d, fleet.policy, now)), None)
    return viable or (ranked[0] if ranked else None)


# Why a proof never comes from an original supervisor, said where the reason says it is missing.
_NEVER_PROVEN = {
    ReadinessCheck.BASELINES: (
        ": its supervisor runs no golden probes (it does not list the feature probe.golden; "
        f"the original supervisor does not), so none can be recorded; accept it with {ACCEPT_KEY}"
    ),
    ReadinessCheck.TRAINER: (
        " as far as its supervisor says: it reports no checkpoint times (the original "
        f"supervisor does not), so this cannot be proven; accept it with {ACCEPT_KEY}"
    ),
}


def _standby_reason(fleet: FleetView, standby: DomainView, now: datetime) -> Reason:
    seen = standby.last_seen_at
    if is_viable_standby(standby, fleet.policy, now):
        return Reason(
            ReadinessCheck.STANDBY, True, f"{standby.slug} is ready and its heartbeat fresh", seen
        )
    if seen is None:
        why = "has never answered a heartbeat"
    elif is_stale(standby, fleet.policy, now):
        why = f"heartbeat stale ({_seconds(_age_ms(seen, now))} old)"
    elif standby.state != DomainState.READY:
        why = f"is {standby.state}"
    elif not standby.supervisor_url:
        why = "has no supervisor URL"
    elif not standby.has_bindings:
        why = "has no model bindings"
    else:
        why = "has a failed inference slot"
    return Reason(ReadinessCheck.STANDBY, False, f"{standby.slug} {why}", seen)


def _asleep_reason(standby: DomainView) -> Reason:
    # Slot states are mirrored from heartbeats: the posture is as of the last one.
    seen = standby.last_seen_at
    bound = {m.slot_id for m in standby.models}
    awake = sorted(
        f"GPU {s.gpu_index} {s.state}"
        for s in standby.slots
        if s.kind == SlotKind.INFERENCE and s.id in bound and s.state != InferenceState.SLEEPING
    )
    if awake:
        return Reason(
            ReadinessCheck.MODELS_ASLEEP, False, "not in standby posture: " + ", ".join(awake), seen
        )
    return Reason(ReadinessCheck.MODELS_ASLEEP, True, "every bound model is asleep", seen)


def _baselines_reason(facts: StandbyFacts, standby: DomainView) -> Reason:
    if facts.missing_baselines:
        # What is missing follows from what the standby reported it serves (its models and
        # their engine version): as of its last heartbeat.
        missing = ", ".join(facts.missing_baselines)
        why = "" if facts.golden_probes else _NEVER_PROVEN[ReadinessCheck.BASELINES]
        return Reason(
            ReadinessCheck.BASELINES,
            False,
            f"no golden baseline yet for {missing}{why}",
            standby.last_seen_at,
        )
    return Reason(
        ReadinessCheck.BASELINES,
        True,
        "every model and adapter has a golden baseline",
        facts.baselines_at or standby.last_seen_at,
    )


def _adapters_reason(facts: StandbyFacts, standby: DomainView) -> Reason:
    if facts.missing_adapters:
        return Reason(
            ReadinessCheck.ADAPTERS,
            False,
            "the standby does not hold routed adapter versions "
            + ", ".join(facts.missing_adapters[:8])
            + ": a failover there fails its adapter probe",
            standby.last_seen_at,
        )
    return Reason(
        ReadinessCheck.ADAPTERS,
        True,
        f"the standby holds every routed adapter version ({len(facts.routed_adapters)})",
        standby.last_seen_at,
    )


def _memory_reason(facts: StandbyFacts, standby: DomainView) -> Reason:
    at = facts.gpus_read_at or standby.last_seen_at
    if facts.wake_mib is None:
        return Reason(
            ReadinessCheck.WAKE_MEMORY,
            None,
            "the layout plans no memory: the wake's need is unknown",
            at,
        )
    if not facts.gpus:
        return Reason(
            ReadinessCheck.WAKE_MEMORY, None, "no GPU memory reading from the standby yet", at
        )
    short = []
    for index, need in sorted(facts.wake_mib.items()):
        gpu = next((g for g in facts.gpus if g.index == index), None)
        if gpu is None:
            short.append(f"GPU {index} not reported")
            continue
        free = gpu.total_mib - gpu.used_mib
        if free < need:
            short.append(f"GPU {index} has {free:.0f} MiB free, the wake needs {need:.0f}")
    if short:
        return Reason(ReadinessCheck.WAKE_MEMORY, False, "; ".join(short), at)
    return Reason(
        ReadinessCheck.WAKE_MEMORY, True, "the memory each wake restores is free on every GPU", at
    )


def _trainer_reason(
    facts: StandbyFacts, standby: DomainView, max_age_ms: int, now: datetime
) -> Reason:
    seen = standby.last_seen_at  # trainer states come with the heartbeat
    if not facts.trainers:
        return Reason(ReadinessCheck.TRAINER, True, "no trainer on the standby", seen)
    problems, oldest = [], None
    for t in facts.trainers:
        at = t.last_checkpoint_at
        if at is not None and (oldest is None or at < oldest):
            oldest = at
        if t.state != TrainerReportState.RUNNING:
            problems.append(f"GPU {t.gpu_index} trainer {t.state}")
        elif at is None:
            why = "" if facts.checkpoint_times else _NEVER_PROVEN[ReadinessCheck.TRAINER]
            problems.append(f"GPU {t.gpu_index} trainer has not checkpointed{why}")
        elif _age_ms(at, now) > max_age_ms:
            problems.append(
                f"GPU {t.gpu_index} last checkpoint {_seconds(_age_ms(at, now))} ago "
                f"(limit {_seconds(max_age_ms)})"
            )
    if problems:
        return Reason(ReadinessCheck.TRAINER, False, "; ".join(problems), oldest or seen)
    return Reason(ReadinessCheck.TRAINER, True, "every trainer is checkpointing", oldest or seen)


def _drill_reason(drill: DrillFacts | None, max_age_ms: int, now: datetime) -> Reason:
    if drill is None:
        return Reason(ReadinessCheck.DRILL, None, "no drill has run yet")
    if not drill.passed:
        return Reason(
            ReadinessCheck.DRILL,
            False,
            f"the last drill failed: {drill.message}",
            drill.finished_at,
        )
    age = _age_ms(drill.finished_at, now)
    if age > max_age_ms:
        return Reason(
            ReadinessCheck.DRILL,
            False,
            f"the last drill passed {_seconds(age)} ago (limit {_seconds(max_age_ms)})",
            drill.finished_at,
        )
    return Reason(ReadinessCheck.DRILL, True, "the last drill passed", drill.finished_at)


def failover_readiness(
    fleet: FleetView,
    facts: Mapping[str, StandbyFacts],
    last_drill: DrillFacts | None,
    now: datetime,
) -> Readiness:
    """Judge whether a failover now would succeed; `facts` is keyed by domain id."""
    policy = fleet.policy
    standby = pick_standby(fleet, now)
    if standby is None:
        reason = Reason(ReadinessCheck.STANDBY, False, "the fleet has no standby domain")
        return Readiness(ReadinessVerdict.NOT_READY, None, (reason,), now)
    own = facts.get(standby.id, StandbyFacts())
    judged: tuple[Reason, ...] = (
        _standby_reason(fleet, standby, now),
        _asleep_reason(standby),
        _baselines_reason(own, standby),
        _memory_reason(own, standby),
        _trainer_reason(own, standby, policy.checkpoint_max_age_ms, now),
        _drill_reason(last_drill, policy.drill_max_age_ms, now),
    )
    if own.routed_adapters:
        judged = (*judged, _adapters_reason(own, standby))
    reasons = tuple(_accepted(r, policy.readiness_accept_missing) for r in judged)
    if any(r.ok is False and r.check in _BLOCKING for r in reasons):
        verdict = ReadinessVerdict.NOT_READY
    elif all(r.counts_as_proven for r in reasons):
        verdict = ReadinessVerdict.READY
    else:
        verdict = ReadinessVerdict.AT_RISK
    return Readiness(verdict, standby.slug, reasons, now)


def _accepted(reason: Reason, accept: Collection[str]) -> Reason:
    """Mark an unproven reason the policy accepts. A blocking failure (no viable standby, a
    wake that does not fit) is never accepted: a failover now would fail whatever is accepted."""
    if reason.ok is True or reason.check not in accept:
        return reason
    if reason.ok is False and reason.check in _BLOCKING:
        return reason
    return replace(reason, accepted=True)
