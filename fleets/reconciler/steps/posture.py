"""Put a domain in standby posture: models asleep (proven), then training running (proven).

Shared by the demote steps, the promotion's best-effort steps on the old active, and the
clean-up after a failed promotion. Each helper checks first and nudges only what is not there
yet, so calling it again is harmless. Slots move only once the supervisor proves the posture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleets.core.report import StatusReport
from fleets.core.states import InferenceState, TrainingState
from fleets.models import Domain
from fleets.reconciler.steps.base import SlotMover, bound_inference, training_slots
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.transport import Call

# Every live inference state a proven sleep may settle (the state table allows each -> sleeping).
_TO_SLEEPING_FROM = frozenset(
    {
        InferenceState.SERVING,
        InferenceState.FAILED,
        InferenceState.WAKING,
        InferenceState.PROBING,
        InferenceState.STARTING,
    }
)


@dataclass(frozen=True)
class Posture:
    """Whether a domain reached a posture; `call` is the supervisor call that failed, if any."""

    reached: bool
    message: str = ""
    call: Call | None = None
    data: dict[str, Any] = field(default_factory=dict)


def _why(call: Call[Any]) -> str:
    """The message of a call that produced no value."""
    return call.error.message if call.error is not None else "no answer"


def _not_proven_asleep(report: StatusReport, models: list[str]) -> list[str]:
    """Return the bound models that are not proven asleep (unknown and missing count as awake)."""
    out = []
    for name in models:
        m = report.model(name)
        if m is None or m.sleeping is not True:
            out.append(name)
    return out


@dataclass(frozen=True)
class Target:
    """The domain brought to a posture, its supervisor, and who moves its slots."""

    client: SupervisorClient
    domain: Domain
    slot_move: SlotMover


def _settle_sleeping(target: Target, report: StatusReport) -> None:
    slots, _ = bound_inference(target.domain)
    for slot in slots:
        names = list(slot.bindings.values_list("name", flat=True))
        if slot.state == InferenceState.SLEEPING or _not_proven_asleep(report, names):
            continue
        if slot.state in _TO_SLEEPING_FROM:
            target.slot_move(
                slot, InferenceState.SLEEPING, {slot.state}, "sleep proven by the supervisor"
            )


def ensure_asleep(
    target: Target,
    timeout: Callable[[], float],
    budget: Callable[[], float] | None = None,
    drain_bound: Callable[[], int | None] | None = None,
) -> Posture:
    """Check every bound model of the target is asleep; ask the supervisor to sleep them if not.

    `budget` says how long the step still waits (seconds): the supervisor is told, so that
    its drain before the sleep ends in time for the sleep to finish within it. `drain_bound`
    gives the drain's own bound in ms (None: drain in full), asked after the status read, so
    it sees the features that read learned."""
    client = target.client
    _, models = bound_inference(target.domain)
    if not models:
        return Posture(True, "no bound models", data={"models": []})
    for attempt in range(2):
        status = client.status(timeout=timeout())
        report = status.value
        if report is None:
            return Posture(False, f"status: {_why(status)}", call=status)
        awake = _not_proven_asleep(report, models)
        if not awake:
            _settle_sleeping(target, report)
            return Posture(True, "every bound model is asleep", data={"models": models})
        draining = [n for n in awake if (m := report.model(n)) and m.draining]
        if draining:
            # The supervisor is letting running requests finish: wait, don't ask again.
            return Posture(False, f"draining before sleep: {', '.join(draining)}")
        if attempt == 1:
            break
        # The supervisor's sleep is idempotent: models already asleep are left alone, and a
        # sleep still draining is joined, not restarted.
        slept = client.sleep(
            timeout=timeout(),
            budget=budget() if budget else None,
            drain_bound_ms=drain_bound() if drain_bound else None,
        )
        if not slept.ok:
            return Posture(False, f"sleep: {_why(slept)}", call=slept)
        if slept.value is not None and slept.value.get("status") == "draining":
            return Posture(False, f"draining before sleep: {', '.join(awake)}")
    return Posture(False, f"not asleep yet: {', '.join(awake)}")


def ensure_training(target: Target, timeout: Callable[[], float]) -> Posture:
    """Check every training slot of the target runs with a PID; start training if not."""
    client = target.client
    slots = training_slots(target.domain)
    if not slots:
        return Posture(True, "no training slots", data={"trainingSlots": 0})
    for attempt in range(2):
        status = client.status(timeout=timeout())
        reported = status.value
        if reported is None:
            return Posture(False, f"status: {_why(status)}", call=status)
        missing = []
        pids: dict[str, list[int]] = {}
        for slot in slots:
            report = reported.training(slot.gpu_index)
            if report is None or not report.running_with_pid:
                missing.append(slot)
                continue
            if slot.state != TrainingState.TRAINING:
                # Only now, with a PID in hand: "running" without one never counts.
                target.slot_move(
                    slot,
                    TrainingState.TRAINING,
                    {TrainingState.IDLE},
                    "training proven running by the supervisor",
                    pids=list(report.pids),
                )
            pids[str(slot.gpu_index)] = list(report.pids)
        if not missing:
            return Posture(True, "training runs on every training slot", data={"pids": pids})
        if attempt == 1:
            break
        started = client.training_start(timeout=timeout())
        if not started.ok:
            return Posture(False, f"training start: {_why(started)}", call=started)
    gpus = ", ".join(f"GPU {s.gpu_index}" for s in missing)
    return Posture(False, f"training not running yet on {gpus}")
