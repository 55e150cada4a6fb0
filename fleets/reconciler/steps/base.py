"""What every step executor shares: the context it runs in, its result, and layout reads.

An executor is a re-entrant check-and-nudge: it reads where the world is (the supervisor's
report, the database), nudges it one move further when it is not there yet, and answers
done, pending or failed. Running it twice does no harm, and a step interrupted by a crash
simply runs again. Executors never open a transaction around a supervisor call; every state
change they make goes through `fleets.services`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleets.base import clock
from fleets.base.conf import haru_settings
from fleets.core.policy import Policy
from fleets.core.states import OperationErrorCode, SlotKind, Step, leg_step
from fleets.models import Domain, Id, ModelBinding, Operation, Slot
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.transport import CALL_CAP_S, Call
from fleets.services.transitions import slot_transition

DONE = "done"
PENDING = "pending"
FAILED = "failed"

# Codes an operation can fail with, by their short names (fleets.core.states.OperationErrorCode).
SUPERVISOR_UNAUTHORIZED = OperationErrorCode.SUPERVISOR_UNAUTHORIZED
STEP_TIMEOUT = OperationErrorCode.STEP_TIMEOUT
PROBE_FAILED = OperationErrorCode.PROBE_FAILED
CAS_LOST = OperationErrorCode.CAS_LOST
NO_SUPERVISOR = OperationErrorCode.NO_SUPERVISOR
TARGET_IS_ACTIVE = OperationErrorCode.TARGET_IS_ACTIVE
NO_INFERENCE_BINDINGS = OperationErrorCode.NO_INFERENCE_BINDINGS
SOURCE_GONE = OperationErrorCode.SOURCE_GONE
INSUFFICIENT_GPU_MEMORY = OperationErrorCode.INSUFFICIENT_GPU_MEMORY

# How soon a step waiting on the outside world is looked at again.
RETRY_FAST_MS = 15
RETRY_MS = 200
# After a failed supervisor call (a wake that errored, an unreachable host) the step retries
# this often, and each retry is an `operation.step.retry` event: the operator sees every
# attempt, and a step budget of minutes makes a bounded number of events.
TROUBLE_RETRY_MS = 1000


@dataclass(frozen=True)
class StepResult:
    status: str
    # done: the event outcome ("done", "skipped") and what to record with it
    outcome: str = "done"
    data: dict[str, Any] = field(default_factory=dict)
    # failed: the operation's error code and message
    code: str = ""
    message: str = ""
    # pending: when to look again, and what we are waiting for (kept for the timeout message)
    retry_ms: int = RETRY_MS
    # pending because a supervisor call failed (each retry is recorded as an event)
    trouble: bool = False

    @property
    def done(self) -> bool:
        return self.status == DONE

    @property
    def failed(self) -> bool:
        return self.status == FAILED


def done(outcome: str = "done", **data: Any) -> StepResult:
    return StepResult(DONE, outcome=outcome, data=data)


def pending(message: str, retry_ms: int = RETRY_MS) -> StepResult:
    return StepResult(PENDING, message=message, retry_ms=retry_ms)


def failed(code: str, message: str) -> StepResult:
    return StepResult(FAILED, code=code, message=message)


@dataclass(frozen=True)
class SlotMover:
    """Moves slots for an operation: each move guarded by the states it may come from, and
    recorded under the operation and the actor."""

    operation_id: Id | None  # None: a rollout (fleets/reconciler/rollout.py) moves it
    actor: str

    def __call__(
        self, slot: Slot, to_state: str, from_states: Iterable[str], reason: str, **extra: Any
    ) -> bool:
        """Move `slot` to `to_state` if it is still in one of `from_states`; return whether."""
        return slot_transition(
            slot_id=slot.id,
            to_state=to_state,
            from_states=from_states,
            actor=self.actor,
            reason=reason,
            operation_id=self.operation_id,
            extra=extra or None,
        )


@dataclass
class StepContext:
    """Everything an executor needs, loaded once per nudge."""

    operation: Operation
    policy: Policy
    step: str
    client_for: Callable[[Domain], SupervisorClient]
    actor: str = "reconciler"

    @property
    def started_at(self) -> datetime:
        return self.operation.step_started_at or clock.now()

    @property
    def budget_ms(self) -> int:
        budget = self.policy.step_timeout_ms(self.step)
        if leg_step(self.step) == Step.DEMOTE_OLD_SLEEP:
            # The wait for proxies to move off the old active comes first and is not the
            # sleep's time: a sleepTimeoutMs shorter than it must not time the step out unslept.
            budget += switch_settle_ms()
        return budget

    @property
    def deadline(self) -> datetime:
        return self.started_at + timedelta(milliseconds=self.budget_ms)

    def remaining_s(self) -> float:
        return (self.deadline - clock.now()).total_seconds()

    def expired(self) -> bool:
        return self.remaining_s() <= 0

    @property
    def slot_move(self) -> SlotMover:
        """Move a slot on this operation's behalf."""
        return SlotMover(self.operation.id, self.actor)

    def call_timeout(self) -> float:
        """Cap one supervisor call at min(10 s, what is left of the step's budget)."""
        return min(CALL_CAP_S, self.remaining_s())

    @property
    def target(self) -> Domain:
        target = self.operation.target_domain
        if target is None:
            # Only a finished operation loses its target (a prune refuses while one is in
            # flight), so this is a broken invariant, not a state to step through.
            raise LookupError(f"operation {self.operation.id} has no target domain")
        return target

    @property
    def source(self) -> Domain | None:
        return self.operation.source_domain


# Runs one step of an operation; each kind's executors are a registry keyed by Step.
Executor = Callable[[StepContext], StepResult]


def training_slots(domain: Domain) -> list[Slot]:
    """Return the layout's training slots of a domain, by GPU."""
    return list(Slot.objects.filter(domain=domain, kind=SlotKind.TRAINING).order_by("gpu_index"))


def bound_inference(domain: Domain) -> tuple[list[Slot], list[str]]:
    """Return the inference slots that carry bindings, and every bound model name."""
    bindings = list(ModelBinding.objects.filter(domain=domain).order_by("name"))
    slot_ids = {b.slot_id for b in bindings}
    slots = list(Slot.objects.filter(pk__in=slot_ids).order_by("gpu_index"))
    return slots, [b.name for b in bindings]


def supervisor_trouble(call: Call, *, on_target: bool, what: str) -> StepResult:
    """Turn a failed supervisor call into the step's answer.

    401/403 on the target fails at once: waiting cannot fix a wrong token. Everything else
    (network, timeout, a bad body, a 5xx) may be transient and stays pending until the step's
    budget runs out. Calls to the old active are always pending: they are best effort.
    """
    assert call.error is not None
    if call.unauthorized and on_target:
        return failed(SUPERVISOR_UNAUTHORIZED, f"{what}: {call.error.message}")
    return StepResult(
        PENDING, message=f"{what}: {call.error.message}", retry_ms=TROUBLE_RETRY_MS, trouble=True
    )


def percent(ratio: float) -> str:
    return f"{ratio * 100:.1f}%"


# Added to the longest time a proxy may still route on the old pointer: a request that read the
# pointer just before the switch may still be on its way to the old active.
SWITCH_SETTLE_MARGIN_MS = 250


# After a routing commit, how long the tick that made it leaves this host to the data path
# before its next work (advance.py). The commit releases at once every request and stream the
# proxies held for the fleet; where the reconciler shares a process with a proxy (the embedded
# server), its next queries would take the interpreter lock and the CPU from exactly that burst
# (a third of a 200-stream burst's wall time, bench/failover_load.py --streams). Nothing is
# lost by waiting: the step after a switch waits `switch_settle_ms` before acting anyway.
SWITCH_QUIET_MS = 150


def switch_settle_ms() -> int:
    """How long after the switch commits the old active may still receive new requests.

    The proxy re-reads routing at least every `chat_hold_poll_ms` (the pushed revision's poll
    fallback) and trusts a cached snapshot for at most the snapshot TTL: past the longer of the
    two (plus a margin), no proxy sends the old active anything new.
    """
    config = haru_settings()
    return max(config.chat_hold_poll_ms, config.snapshot_cache_ttl_ms) + SWITCH_SETTLE_MARGIN_MS
