"""Heartbeat mirroring: which state a slot or domain moves to, given what its supervisor says.

Pure rules (docs/design.md, "Heartbeats"); the reconciler reads the report, reduces each bound model
and trainer to a posture, asks these functions, and writes any move with a guarded CAS. Only
steady-state pairs are mirrored: the in-between states (waking, probing, stopping, training's
stopping) belong to the operation step that set them, and never move here.

- inference, on the active: serving <-> failed; healthy means every bound model awake.
- inference, on a standby: sleeping <-> failed; unreachable, missing or awake all count as
  failed. A standby's serving slot settles to sleeping (or failed) once no operation is in
  flight.
- training: idle -> training needs a running trainer with a PID; training -> idle when the
  trainer is reported idle or not at all.
- domains: provisioning -> ready (degraded for an active not fully awake); failed -> degraded
  once reachable (the active also needs every model awake); ready -> degraded for an active
  not fully awake or any unreachable domain; degraded -> ready on recovery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from fleets.core.states import DomainState, InferenceState, TrainingState


class ModelPosture(StrEnum):
    """What one heartbeat says about one bound model."""

    AWAKE = "awake"
    ASLEEP = "asleep"
    UNKNOWN = "unknown"  # listed, but whether it sleeps is not known
    MISSING = "missing"  # not in the report (or no report at all)


class TrainerPosture(StrEnum):
    """What one heartbeat says about the trainer on a GPU."""

    RUNNING = "running"  # running, with a PID to prove it
    IDLE = "idle"
    OTHER = "other"  # any other report, "running" without a PID included
    ABSENT = "absent"  # nothing reported for that GPU


@dataclass(frozen=True)
class InferenceMove:
    to_state: InferenceState | None  # None: leave the slot as it is
    in_posture: bool  # whether the slot's models are where the domain's role needs them


def inference_move(
    state: str,
    postures: Sequence[ModelPosture],
    *,
    reachable: bool,
    is_active: bool,
    settle_serving: bool,
) -> InferenceMove:
    """Mirror one inference slot with bound models; `postures` has one entry per binding."""
    moves: dict[str, InferenceState | None]
    if is_active:
        healthy = all(p == ModelPosture.AWAKE for p in postures)
        moves = {
            InferenceState.SERVING: None if healthy else InferenceState.FAILED,
            InferenceState.FAILED: InferenceState.SERVING if healthy else None,
        }
    else:
        healthy = all(p == ModelPosture.ASLEEP for p in postures)
        moves = {
            InferenceState.SLEEPING: None if healthy else InferenceState.FAILED,
            InferenceState.FAILED: InferenceState.SLEEPING if healthy else None,
        }
        if settle_serving:
            # A standby left serving (a promotion that failed after its probe, an old active
            # whose sleep never landed) settles to what it really is once nothing is in flight.
            moves[InferenceState.SERVING] = (
                InferenceState.SLEEPING if healthy else InferenceState.FAILED
            )
    if not reachable:
        in_posture = False
    elif is_active:
        in_posture = healthy
    else:
        # A standby only needs its models known: asleep or awake, it can be woken or slept.
        in_posture = all(p in (ModelPosture.AWAKE, ModelPosture.ASLEEP) for p in postures)
    return InferenceMove(moves.get(state), in_posture)


def training_move(state: str, trainer: TrainerPosture) -> TrainingState | None:
    """Mirror one training slot; None leaves it as it is."""
    if state == TrainingState.IDLE and trainer == TrainerPosture.RUNNING:
        return TrainingState.TRAINING
    if state == TrainingState.TRAINING and trainer in (TrainerPosture.IDLE, TrainerPosture.ABSENT):
        return TrainingState.IDLE
    return None


def domain_move(
    state: str, *, reachable: bool, is_active: bool, in_posture: bool
) -> DomainState | None:
    """Mirror a domain's state from its heartbeat; `in_posture`: every bound slot in posture."""
    if not reachable:
        return DomainState.DEGRADED if state == DomainState.READY else None
    moves: dict[str, DomainState | None]
    if in_posture:
        moves = {
            DomainState.PROVISIONING: DomainState.READY,
            DomainState.DEGRADED: DomainState.READY,
            DomainState.FAILED: DomainState.DEGRADED,
        }
    else:
        moves = {
            DomainState.PROVISIONING: DomainState.DEGRADED if is_active else DomainState.READY,
            DomainState.READY: DomainState.DEGRADED if is_active else None,
            DomainState.FAILED: None if is_active else DomainState.DEGRADED,
        }
    return moves.get(state)
