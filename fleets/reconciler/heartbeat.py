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

GPU memory (`GET /v1/gpu/memory`) is asked for beside the status, on its own pool, and is
display data only: nothing decides on it and nothing waits for it. A beat stores the answer if
it is in by the time the report is written; a slower one is stored by the next beat (one read
per domain in flight at a time, so a hung NVML cannot pile up threads). The report carries it as
`gpus` (the body's list) and `gpusAt` (when it was asked); a 501 (no GPU facts on that host)
drops `gpus`; any other failure keeps the previous `gpus` and `gpusAt` and notes `gpusError`.
Reads are spaced by GPU_MEMORY_EVERY_MS per domain (from the stored answer's time, good or
bad), and skipped while the domain's heartbeat is failing.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleets import clock
from fleets.core.policy import Policy
from fleets.core.states import DomainState, InferenceState, SlotKind, TrainingState
from fleets.models import Domain, ModelBinding, Slot
from fleets.reconciler.client import (
    CALL_CAP_S,
    Call,
    GpuMemory,
    StatusReport,
    SupervisorClient,
    gpu_facts_unavailable,
)
from fleets.services.heartbeats import (
    domain_heartbeat_failed,
    domain_mirror,
    domain_seen,
    slot_mirror,
    slot_pids_record,
)

# Heartbeats of a fleet run side by side: one slow host must not delay the others' news.
_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="haru-heartbeat")
# GPU memory reads get their own threads: a hung NVML must never hold up a status read.
_gpu_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="haru-gpu-memory")
# The dashboard's memory bars need no more than this; ticks during a failover come far faster.
GPU_MEMORY_EVERY_MS = 1000
# The report keys the GPU memory read owns.
GPU_KEYS = ("gpus", "gpusAt", "gpusError")


@dataclass(frozen=True)
class GpuRead:
    """One `GET /v1/gpu/memory` in flight (or answered): when it was asked, and its answer."""

    asked_at: datetime
    future: Future  # of Call[GpuMemory]


# Domain id -> its read not yet stored: at most one per domain in this process.
_gpu_reads: dict[Any, GpuRead] = {}
_gpu_reads_lock = threading.Lock()


@dataclass(frozen=True)
class Beat:
    """One domain's heartbeat: what came back and when we asked."""

    domain: Domain
    observed_at: datetime
    call: Call[StatusReport] | None  # None: the domain has no supervisor URL
    gpu: GpuRead | None = None  # None: no GPU memory read this beat


def heartbeat_timeout(policy: Policy) -> float:
    """Bound a heartbeat well inside the staleness window, so a slow host reads as stale, not
    as a tick that never ends."""
    return max(0.5, min(CALL_CAP_S / 2, policy.heartbeat_stale_ms / 2000))


def heartbeats_collect(domains: list[Domain], *, policy: Policy, client_for) -> list[Beat]:
    """Ask every domain's supervisor for `/v1/status` (and GPU memory), concurrently."""
    timeout = heartbeat_timeout(policy)

    def one(domain: Domain) -> Beat:
        observed = clock.now()
        if not domain.supervisor_url:
            return Beat(domain, observed, None)
        client: SupervisorClient = client_for(domain.supervisor_url)
        gpu = _gpu_read_start(domain, client, timeout=timeout, now=observed)
        return Beat(domain, observed, client.status(timeout=timeout), gpu)

    return list(_pool.map(one, domains))


def _gpu_read_start(
    domain: Domain, client: SupervisorClient, *, timeout: float, now: datetime
) -> GpuRead | None:
    """Start this domain's GPU memory read, or join the one still unstored; None if the stored
    answer is recent enough."""
    with _gpu_reads_lock:
        held = _gpu_reads.get(domain.id)
        if held is not None:
            return held  # still running (or answered after its beat was written): use that one
        if not _gpu_read_due(domain.last_report, now):
            return None
        read = GpuRead(now, _gpu_pool.submit(client.gpu_memory, timeout=timeout))
        _gpu_reads[domain.id] = read
        return read


def pending_gpu_read(domain_id) -> GpuRead | None:
    """Return the domain's GPU memory read not yet stored, if any (tests wait on it)."""
    with _gpu_reads_lock:
        return _gpu_reads.get(domain_id)


def _gpu_read_due(report: Any, now: datetime) -> bool:
    """Whether to ask for GPU memory now: not while the heartbeat is failing (the status call
    says whether the host is there; no second call to a dead host), and not again within
    GPU_MEMORY_EVERY_MS of the last answer, good or bad."""
    if not isinstance(report, dict):
        return True
    heartbeat = report.get("heartbeat")
    if isinstance(heartbeat, dict) and heartbeat.get("ok") is False:
        return False
    error = report.get("gpusError")
    asked = [_parse_time(report.get("gpusAt"))]
    if isinstance(error, dict):
        asked.append(_parse_time(error.get("at")))
    last = max((a for a in asked if a is not None), default=None)
    if last is None:
        return True
    return not timedelta(0) <= now - last < timedelta(milliseconds=GPU_MEMORY_EVERY_MS)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _gpu_fields(beat: Beat, previous: Any) -> dict[str, Any] | None:
    """Return the GPU keys to store with this beat's report, or None if nothing came in.

    Never waits: a read still running is left for the next beat. An answered read is taken off
    the in-flight table here, whether or not this beat's status was good.
    """
    read = beat.gpu
    if read is None or not read.future.done():
        return None
    with _gpu_reads_lock:
        if _gpu_reads.get(beat.domain.id) is read:
            del _gpu_reads[beat.domain.id]
    call: Call[GpuMemory] = read.future.result()
    asked_at = clock.iso(read.asked_at)
    if call.ok:
        return {"gpus": list(call.value.raw.get("gpus") or []), "gpusAt": asked_at}
    err = call.error
    error = {"kind": err.kind, "status": err.status, "message": err.message, "at": asked_at}
    if gpu_facts_unavailable(err):
        # An answer, not a failure: this host has no GPU facts, so no bars rather than old ones.
        return {"gpusAt": asked_at, "gpusError": error}
    kept = {
        k: previous[k] for k in ("gpus", "gpusAt") if isinstance(previous, dict) and k in previous
    }
    return {**kept, "gpusError": error}


def _with_gpus(report: dict[str, Any], fields: dict[str, Any] | None, previous: Any) -> dict:
    """Merge the GPU keys into the status body: this beat's answer, else the previous ones."""
    if fields is None:
        fields = {k: previous[k] for k in GPU_KEYS if isinstance(previous, dict) and k in previous}
    if not fields:
        return report
    return {**{k: v for k, v in report.items() if k not in GPU_KEYS}, **fields}


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
    # Taken only now, after the state decisions: GPU memory never holds them up.
    gpu_fields = _gpu_fields(beat, domain.last_report)
    if report is not None:
        domain_seen(
            domain_id=domain.id,
            fleet_id=domain.fleet_id,
            seen_at=beat.observed_at,
            report=_with_gpus(report.raw, gpu_fields, domain.last_report),
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
