"""State tables: every allowed (from, to) pair for domains, slots and operations.

The services check each conditional UPDATE against these tables before writing, so a refused
pair raises and never reaches the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class DomainState(StrEnum):
    PROVISIONING = "provisioning"
    READY = "ready"
    DEGRADED = "degraded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"


class InferenceState(StrEnum):
    STARTING = "starting"
    SERVING = "serving"
    SLEEPING = "sleeping"
    WAKING = "waking"
    PROBING = "probing"
    FAILED = "failed"
    STOPPED = "stopped"


class TrainingState(StrEnum):
    IDLE = "idle"
    TRAINING = "training"
    STOPPING = "stopping"
    FAILED = "failed"
    STOPPED = "stopped"


class SlotKind(StrEnum):
    INFERENCE = "inference"
    TRAINING = "training"


class OperationKind(StrEnum):
    PROMOTE = "promote"
    DEMOTE = "demote"
    # Proves a standby can take over without moving routing (fleets/core/drills.py).
    DRILL = "drill"


class OperationState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class CleanupState(StrEnum):
    """Putting a failed or cancelled promotion's target back in standby posture.

    Recorded with the failure, in the same transaction, so a worker that dies before the
    clean-up runs leaves it `pending` for the next tick instead of losing it.
    """

    NONE = ""
    PENDING = "pending"
    DONE = "done"  # standby posture proven (models asleep, training running)
    INCOMPLETE = "incomplete"  # ran, posture not proven: left to restoreStandbyOnReturn
    SKIPPED = "skipped"  # nothing to do, or another operation (or routing) owns the target


class Provider(StrEnum):
    """Who provisions a domain. The core asks one thing: static or not. Every other provider is
    a driver's name, and the driver registry (`fleets/drivers/registry.py`) is the list; the
    built-in cloud ones are named here for their callers."""

    STATIC = "static"
    SKYPILOT = "skypilot"
    SKYSERVE = "skyserve"


class DomainRole(StrEnum):
    """A domain's place in its fleet: the one the route pointer names, or a standby."""

    ACTIVE = "active"
    STANDBY = "standby"


D, I, T, O = DomainState, InferenceState, TrainingState, OperationState  # noqa: E741

# Domain lifecycle. stopping is reachable from every "up" state; stopped only leads back to
# provisioning, so a stopped machine is re-provisioned before it can serve again.
DOMAIN_TRANSITIONS: dict[DomainState, frozenset[DomainState]] = {
    D.PROVISIONING: frozenset({D.READY, D.DEGRADED, D.FAILED, D.STOPPING}),
    D.READY: frozenset({D.DEGRADED, D.FAILED, D.STOPPING}),
    D.DEGRADED: frozenset({D.READY, D.FAILED, D.STOPPING}),
    D.FAILED: frozenset({D.PROVISIONING, D.DEGRADED, D.STOPPING}),
    D.STOPPING: frozenset({D.STOPPED}),
    D.STOPPED: frozenset({D.PROVISIONING}),
}

# Inference slots. Every live state may also fail or stop; failed recovers to whichever posture
# the heartbeat proves (serving on the active, sleeping on a standby) or is retried by a wake.
INFERENCE_TRANSITIONS: dict[InferenceState, frozenset[InferenceState]] = {
    I.STARTING: frozenset({I.SERVING, I.SLEEPING, I.FAILED, I.STOPPED}),
    I.SERVING: frozenset({I.SLEEPING, I.FAILED, I.STOPPED}),
    I.SLEEPING: frozenset({I.WAKING, I.FAILED, I.STOPPED}),
    I.WAKING: frozenset({I.PROBING, I.SLEEPING, I.FAILED, I.STOPPED}),
    I.PROBING: frozenset({I.SERVING, I.SLEEPING, I.FAILED, I.STOPPED}),
    I.FAILED: frozenset({I.SERVING, I.SLEEPING, I.WAKING, I.STARTING, I.STOPPED}),
    I.STOPPED: frozenset({I.STARTING}),
}

TRAINING_TRANSITIONS: dict[TrainingState, frozenset[TrainingState]] = {
    T.IDLE: frozenset({T.TRAINING, T.FAILED, T.STOPPED}),
    T.TRAINING: frozenset({T.STOPPING, T.IDLE, T.FAILED, T.STOPPED}),
    T.STOPPING: frozenset({T.IDLE, T.TRAINING, T.FAILED, T.STOPPED}),
    # A failed trainer may be retired for good as well as reset, like a failed inference slot.
    T.FAILED: frozenset({T.IDLE, T.STOPPED}),
    T.STOPPED: frozenset({T.IDLE}),
}

OPERATION_TRANSITIONS: dict[OperationState, frozenset[OperationState]] = {
    O.PENDING: frozenset({O.RUNNING, O.FAILED, O.CANCELLED}),
    O.RUNNING: frozenset({O.SUCCEEDED, O.FAILED, O.CANCELLED}),
    O.SUCCEEDED: frozenset(),
    O.FAILED: frozenset(),
    O.CANCELLED: frozenset(),
}

# Keyed by the enums above; looked up with the plain strings the database holds.
TABLES: dict[str, Mapping[Any, frozenset[str]]] = {
    "domain": DOMAIN_TRANSITIONS,
    "inference": INFERENCE_TRANSITIONS,
    "training": TRAINING_TRANSITIONS,
    "operation": OPERATION_TRANSITIONS,
}

PROMOTABLE_DOMAIN_STATES = frozenset({D.READY, D.DEGRADED})
IN_FLIGHT_OPERATION_STATES = frozenset({O.PENDING, O.RUNNING})

# The prefix that names a round-trip drill's second leg: the same promotion steps, acting on the
# original active (the operation's source) as target and on the drilled standby as the one
# demoted. Distinct names keep each leg's step time and events apart.
BACK_LEG = "back_"


class Step(StrEnum):
    """Every step an operation runs, named once: Operation.current_step and Event.step hold
    these values; the plans below and the executors' registries are keyed by them.

    A new step is a member here (a promotion step also its BACK_LEG twin), its place in a plan
    below, its executor and registry line (fleets/reconciler/steps/promote.py or demote.py;
    the drill's registry follows from theirs) and the policy field whose `steps` it is
    (fleets/core/policy.py). The dashboard's chart colours a promotion step by its CSS class
    (haru/static/haru/dashboard.css, `.s-<step>`)."""

    # The promotion (PROMOTE_STEPS), in order.
    STOP_TRAINING = "stop_training"
    VERIFY_GPU = "verify_gpu"
    WAKE = "wake"
    PROBE = "probe"
    SWITCH_ROUTE = "switch_route"
    DEMOTE_OLD_SLEEP = "demote_old_sleep"
    DEMOTE_OLD_TRAIN = "demote_old_train"
    # The demotion (DEMOTE_STEPS).
    SLEEP = "sleep"
    START_TRAINING = "start_training"
    # A round-trip drill's second leg: each promotion step again, prefixed by BACK_LEG.
    BACK_STOP_TRAINING = BACK_LEG + STOP_TRAINING
    BACK_VERIFY_GPU = BACK_LEG + VERIFY_GPU
    BACK_WAKE = BACK_LEG + WAKE
    BACK_PROBE = BACK_LEG + PROBE
    BACK_SWITCH_ROUTE = BACK_LEG + SWITCH_ROUTE
    BACK_DEMOTE_OLD_SLEEP = BACK_LEG + DEMOTE_OLD_SLEEP
    BACK_DEMOTE_OLD_TRAIN = BACK_LEG + DEMOTE_OLD_TRAIN


S = Step

PROMOTE_STEPS: tuple[Step, ...] = (
    S.STOP_TRAINING,
    S.VERIFY_GPU,
    S.WAKE,
    S.PROBE,
    S.SWITCH_ROUTE,
    S.DEMOTE_OLD_SLEEP,
    S.DEMOTE_OLD_TRAIN,
)
DEMOTE_STEPS: tuple[Step, ...] = (S.SLEEP, S.START_TRAINING)
# A check-only failover drill: the promotion's steps on the standby up to its golden probe,
# then back into standby posture; routing never moves.
DRILL_STEPS: tuple[Step, ...] = (
    S.STOP_TRAINING,
    S.VERIFY_GPU,
    S.WAKE,
    S.PROBE,
    S.SLEEP,
    S.START_TRAINING,
)
# A "promote and promote back" drill: the promotion to the standby, routing moves, the original
# active is demoted; then the promotion back to the original active and the standby's demotion.
ROUND_TRIP_DRILL_STEPS: tuple[Step, ...] = PROMOTE_STEPS + tuple(
    Step(BACK_LEG + step) for step in PROMOTE_STEPS
)
# The steps of a failover up to the routing commit (the promotion's prefix that a recovery
# sample times: fleets.core.recovery).
FAILOVER_PATH: tuple[Step, ...] = PROMOTE_STEPS[: PROMOTE_STEPS.index(S.SWITCH_ROUTE) + 1]
# Steps after the pointer moved: they act on the old active and never fail the operation.
BEST_EFFORT_STEPS = frozenset({S.DEMOTE_OLD_SLEEP, S.DEMOTE_OLD_TRAIN})


class OperationErrorCode(StrEnum):
    """Every code an operation's `error.code` may hold: why it failed, or why it was cancelled
    (CANCEL_REASONS). docs/design.md lists them ("Error codes", "Cancel reasons"); a test
    checks that list against this one."""

    # A 401/403 from the target's supervisor: waiting cannot fix a wrong token.
    SUPERVISOR_UNAUTHORIZED = "supervisor_unauthorized"
    # The step's budget (the policy's step timeout) ran out.
    STEP_TIMEOUT = "step_timeout"
    PROBE_FAILED = "probe_failed"
    # A woken model answered differently from its golden baseline (fleets.core.golden).
    PROBE_MISMATCH = "probe_mismatch"
    # The routing pointer moved under the switch's compare-and-swap.
    CAS_LOST = "cas_lost"
    NO_SUPERVISOR = "no_supervisor"
    TARGET_IS_ACTIVE = "target_is_active"
    NO_INFERENCE_BINDINGS = "no_inference_bindings"
    # A round-trip drill whose original active was removed before it could be promoted back.
    SOURCE_GONE = "source_gone"
    # The supervisor's pre-wake check: free GPU memory does not cover what the servers restore.
    INSUFFICIENT_GPU_MEMORY = "insufficient_gpu_memory"
    # Cancel reasons: an operator cancelled it (API, dashboard, admin), or a failover
    # pre-empted it (fleets.core.preemption).
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"


CANCEL_REASONS = frozenset({OperationErrorCode.CANCELLED, OperationErrorCode.PREEMPTED})


class DrillMode(StrEnum):
    """What a drill proves (fleets/core/drills.py)."""

    # The standby wakes and passes its golden probe, then goes back; routing never moves.
    CHECK = "check"
    # Promote the standby and promote the original active back: routing moves twice.
    ROUND_TRIP = "round_trip"


def leg_step(step: str) -> str:
    """The promotion step a (possibly second-leg) round-trip drill step runs."""
    return step.removeprefix(BACK_LEG)


def on_leg_of(step: Step, other: str) -> Step:
    """`step` on the same leg as the step `other` (a round-trip drill's second leg names its
    steps with BACK_LEG)."""
    return Step(BACK_LEG + step) if other.startswith(BACK_LEG) else step


def steps_for(kind: str, drill_mode: str = "") -> tuple[Step, ...]:
    """Return the ordered steps of an operation kind (and, for a drill, its mode)."""
    if kind == OperationKind.PROMOTE:
        return PROMOTE_STEPS
    if kind == OperationKind.DEMOTE:
        return DEMOTE_STEPS
    if kind == OperationKind.DRILL:
        return ROUND_TRIP_DRILL_STEPS if drill_mode == DrillMode.ROUND_TRIP else DRILL_STEPS
    # A typo must not silently run the demote plan.
    raise ValueError(f"unknown operation kind {kind!r}")


def initial_domain_state(provider: str) -> DomainState:
    """The state a new domain starts in: static hosts exist already and start ready;
    driver-backed ones (SkyPilot, SkyServe) must be provisioned first."""
    return DomainState.READY if provider == Provider.STATIC else DomainState.PROVISIONING


def initial_slot_state(kind: str, *, on_active: bool) -> InferenceState | TrainingState:
    """The state a new slot starts in: training idle; inference serving on the active domain,
    else sleeping. The next heartbeat corrects it from what the host reports."""
    if kind == SlotKind.TRAINING:
        return TrainingState.IDLE
    if kind == SlotKind.INFERENCE:
        return InferenceState.SERVING if on_active else InferenceState.SLEEPING
    raise ValueError(f"unknown slot kind {kind!r}")


class InvalidTransition(Exception):
    """A (from, to) pair that the state table refuses."""

    def __init__(self, table: str, from_state: str, to_state: str) -> None:
        super().__init__(f"{table}: {from_state} -> {to_state} is not an allowed transition")
        self.table = table
        self.from_state = from_state
        self.to_state = to_state


def allowed_sources(table: str, to_state: str) -> frozenset[str]:
    """Return every state from which `to_state` may be reached in `table`."""
    return frozenset(src for src, dsts in TABLES[table].items() if to_state in dsts)


def check_transition(table: str, from_state: str, to_state: str) -> None:
    """Raise InvalidTransition unless `table` allows from_state -> to_state."""
    if table not in TABLES:
        raise ValueError(f"unknown state table {table!r}")
    allowed = TABLES[table].get(from_state)
    if allowed is None or to_state not in allowed:
        raise InvalidTransition(table, from_state, to_state)
