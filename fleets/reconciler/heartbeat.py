"""Heartbeats: ask every domain's supervisor for its status, then mirror what it says.

Reading happens first, for all domains at once (threads, no database, no transaction); applying
happens after, one conditional UPDATE per change (`fleets.services.heartbeats`). Only
steady-state pairs are mirrored; the in-between states (waking, probing, stopping) belong to the
operation step that set them.

Rules (facts.md "Heartbeats"):
- slots: the active's inference serving <-> failed (healthy = every bound model awake); a
  standby's sleeping <-> failed (unreachable, missing or awake all count as failed); a standby's
  serving slot settles to sleeping or failed once no operation is in flight; training
  training <-> idle, where idle -> training needs a PID.
- domains: provisioning -> ready (degraded for a not-ready active); failed -> degraded once
  reachable (the active also needs every model awake); ready -> degraded for an active that is
  not fully awake or any unreachable domain; degraded -> ready on recovery.
- last_seen_at moves only after the slots were mirrored, and only on a good heartbeat.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from fleets import clock
from fleets.core.policy import Policy
from fleets.core.states import DomainState, InferenceState, SlotKind, TrainingState
from fleets.models import Domain, ModelBinding, Slot
from fleets.reconciler.client import CALL_CAP_S, Call, StatusReport, SupervisorClient
from fleets.services.heartbeats import (
    domain_heartbeat_failed,
    domain_mirror,
    domain_seen,
    slot_mirror,
    slot_pids_record,
)

# Heartbeats of a fleet run side by side: one slow host must not delay the others' news.
_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="haru-heartbeat")


@dataclass(frozen=True)
class Beat:
    """One domain's heartbeat: what came back and when we asked."""

    domain: Domain
    observed_at: datetime
    call: Call[StatusReport] | None  # None: the domain has no supervisor URL


def heartbeat_timeout(policy: Policy) -> float:
    """Bound a heartbeat well inside the staleness window, so a slow host reads as stale, not
    as a tick that never ends."""
    return max(0.5, min(CALL_CAP_S / 2, policy.heartbeat_stale_ms / 2000))


def heartbeats_collect(domains: list[Domain], *, policy: Policy, client_for) -> list[Beat]:
    """Ask every domain's supervisor for `/v1/status`, concurrently."""
    timeout = heartbeat_timeout(policy)

    def one(domain: Domain) -> Beat:
        observed = clock.now()
        if not domain.supervisor_url:
            return Beat(domain, observed, None)
        client: SupervisorClient = client_for(domain.supervisor_url)
        return Beat(domain, observed, client.status(timeout=timeout))

    return list(_pool.map(one, domains))


def _models_by_slot(domain: Domain) -> dict:
    out: dict = {}
    for slot_id, name in ModelBinding.objects.filter(domain=domain).values_list("slot_id", "name"):
        out.setdefault(slot_id, []).append(name)
    return out


def heartbeat_apply(
    beat: Beat, *, active_domain_id, operation_in_flight: bool, actor: str = "heartbeat"
) -> None:
    """Mirror one heartbeat onto the domain's slots and state, then record it as seen."""
    domain = beat.domain
    if beat.call is None:
        return  # nothing to ask: a domain without a supervisor is never heartbeat-managed
    is_active = domain.id == active_domain_id
    report = beat.call.value if beat.call.ok else None
    now = clock.now()
    models_by_slot = _models_by_slot(domain)
    slots = list(Slot.objects.filter(domain=domain))
    healthy = True
    for slot in slots:
        if slot.kind == SlotKind.INFERENCE and slot.id in models_by_slot:
            ok = _mirror_inference(
                slot,
                models_by_slot[slot.id],
                report,
                is_active=is_active,
                settle_serving=not operation_in_flight,
                observed_at=beat.observed_at,
                now=now,
                actor=actor,
            )
            healthy = healthy and ok
        elif slot.kind == SlotKind.TRAINING and report is not None:
            _mirror_training(slot, report, observed_at=beat.observed_at, now=now, actor=actor)
    _mirror_domain(domain, report, is_active=is_active, healthy=healthy, beat=beat, now=now)
    if report is not None:
        domain_seen(
            domain_id=domain.id,
            fleet_id=domain.fleet_id,
            seen_at=beat.observed_at,
            report=report.raw,
            previous_report=domain.last_report,
        )
    else:
        err = beat.call.error
        domain_heartbeat_failed(
            domain_id=domain.id,
            fleet_id=domain.fleet_id,
            checked_at=beat.observed_at,
            error={"kind": err.kind, "status": err.status, "message": err.message},
            previous_report=domain.last_report,
        )


def _mirror_inference(
    slot: Slot,
    names: list[str],
    report: StatusReport | None,
    *,
    is_active: bool,
    settle_serving: bool,
    observed_at: datetime,
    now: datetime,
    actor: str,
) -> bool:
    """Mirror one inference slot; return whether its models are in the role's posture."""
    readings = [report.model(n) if report is not None else None for n in names]
    if is_active:
        healthy = all(r is not None and r.sleeping is False for r in readings)
        moves = {
            InferenceState.SERVING: None if healthy else InferenceState.FAILED,
            InferenceState.FAILED: InferenceState.SERVING if healthy else None,
        }
    else:
        healthy = all(r is not None and r.sleeping is True for r in readings)
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
    to_state = moves.get(slot.state)
    if to_state is not None:
        missing = [n for n, r in zip(names, readings, strict=True) if r is None]
        reason = (
            "supervisor unreachable"
            if report is None
            else (f"missing from status: {', '.join(missing)}" if missing else "reported posture")
        )
        slot_mirror(
            slot_id=slot.id,
            from_state=slot.state,
            to_state=to_state,
            observed_at=observed_at,
            now=now,
            reason=reason,
            actor=actor,
        )
    if report is None:
        return False
    # Domain health: the active needs its models awake; a standby only needs them known.
    return healthy if is_active else all(r is not None and r.sleeping is not None for r in readings)


def _mirror_training(
    slot: Slot, report: StatusReport, *, observed_at: datetime, now: datetime, actor: str
) -> None:
    reading = report.training(slot.gpu_index)
    running = reading is not None and reading.running_with_pid
    pids = list(reading.pids) if reading is not None else []
    if slot.state == TrainingState.IDLE and running:
        slot_mirror(
            slot_id=slot.id,
            from_state=slot.state,
            to_state=TrainingState.TRAINING,
            observed_at=observed_at,
            now=now,
            pids=pids,
            reason="trainer running",
            actor=actor,
        )
    elif slot.state == TrainingState.TRAINING and (reading is None or reading.state == "idle"):
        slot_mirror(
            slot_id=slot.id,
            from_state=slot.state,
            to_state=TrainingState.IDLE,
            observed_at=observed_at,
            now=now,
            pids=[],
            reason="trainer not running",
            actor=actor,
        )
    elif slot.state == TrainingState.TRAINING and running and pids != slot.pids:
        slot_pids_record(slot_id=slot.id, pids=pids)


def _mirror_domain(
    domain: Domain,
    report: StatusReport | None,
    *,
    is_active: bool,
    healthy: bool,
    beat: Beat,
    now: datetime,
) -> None:
    state = domain.state
    if report is None:
        to_state = DomainState.DEGRADED if state == DomainState.READY else None
        reason = "heartbeat failed"
    elif healthy:
        to_state = {
            DomainState.PROVISIONING: DomainState.READY,
            DomainState.DEGRADED: DomainState.READY,
            DomainState.FAILED: DomainState.DEGRADED,
        }.get(state)
        reason = "heartbeat healthy"
    else:
        to_state = {
            DomainState.PROVISIONING: DomainState.DEGRADED if is_active else DomainState.READY,
            DomainState.READY: DomainState.DEGRADED if is_active else None,
            DomainState.FAILED: None if is_active else DomainState.DEGRADED,
        }.get(state)
        reason = "not every bound model is awake" if is_active else "model state unknown"
    if to_state is not None:
        domain_mirror(
            domain_id=domain.id,
            from_state=state,
            to_state=to_state,
            observed_at=beat.observed_at,
            now=now,
            reason=reason,
        )
