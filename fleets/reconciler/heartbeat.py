"""Heartbeats: ask every domain's supervisor for its status, then mirror what it says.

Reading happens first, for all domains at once (threads, no database, no transaction); applying
happens after, one conditional UPDATE per change (`fleets.services.heartbeats`). Only
steady-state pairs are mirrored; the in-between states (waking, probing, stopping) belong to the
operation step that set them.

Which state each slot and domain moves to is decided by the pure rules in
`fleets.core.mirror`; this module reduces a report to the postures those rules read, and writes
the moves. last_seen_at moves only after the slots were mirrored, and only on a good heartbeat.

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

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleets.base import clock
from fleets.core.mirror import (
    ModelPosture,
    TrainerPosture,
    domain_move,
    inference_move,
    training_move,
)
from fleets.core.model_health import (
    Reach,
    ServerHealth,
    Verdict,
    model_health,
    needs_direct_check,
    unreachable_verdict,
)
from fleets.core.policy import Policy
from fleets.core.report import TrainerReportState
from fleets.core.states import SlotKind, TrainingState
from fleets.models import Domain, Id, ModelBinding, Slot
from fleets.reconciler.client import (
    CALL_CAP_S,
    Call,
    GpuMemory,
    StatusReport,
    SupervisorClient,
    TrainingReport,
    call_reach,
    gpu_facts_unavailable,
    serving_reach,
)
from fleets.services.heartbeats import (
    binding_engine_version_record,
    domain_heartbeat_failed,
    domain_mirror,
    domain_seen,
    slot_mirror,
    slot_pids_record,
)
from fleets.services.model_health import model_health_record

# At most this many supervisors are asked at once per process; more domains queue.
POOL_THREADS = 16


@functools.cache
def _status_pool() -> ThreadPoolExecutor:
    """Heartbeats of a fleet run side by side: one slow host must not delay the others' news.
    Made on first use, so importing the reconciler (the API, management commands) starts no
    threads."""
    return ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="haru-heartbeat")


@functools.cache
def _gpu_pool() -> ThreadPoolExecutor:
    """GPU memory reads get their own threads: a hung NVML must never hold up a status read.
    At most one read per domain is in flight, so a hung host holds at most one thread."""
    return ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="haru-gpu-memory")


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
    # Model name -> how its own server answered when asked directly (only models the
    # supervisor could not vouch for, on the active).
    direct: dict[str, Reach] = field(default_factory=dict)

    @property
    def supervisor_reach(self) -> Reach:
        return Reach.NOT_ASKED if self.call is None else call_reach(self.call)

    def verdict(self) -> Verdict:
        """What this beat says about the host, in the data-path confirmation's terms."""
        return unreachable_verdict(self.supervisor_reach, list(self.direct.values()))


@functools.cache
def _serving_pool() -> ThreadPoolExecutor:
    """Direct model-server checks: their own threads, so a status read never waits on them."""
    return ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="haru-serving-check")


def serving_check_timeout(policy: Policy) -> float:
    """Bound a direct model-server check (and a confirmation's calls)."""
    return min(heartbeat_timeout(policy), policy.serving_check_timeout_ms / 1000)


def servers_check(urls: dict[str, str], *, timeout: float) -> dict[str, Reach]:
    """Ask each model server (name -> serving URL) directly, concurrently, each bounded."""
    futures = {
        name: _serving_pool().submit(serving_reach, url, timeout=timeout)
        for name, url in urls.items()
    }
    return {name: f.result() for name, f in futures.items()}


def _unvouched(report: StatusReport | None, urls: dict[str, str]) -> dict[str, str]:
    """The models whose supervisor cannot say whether their server serves."""
    return {
        name: url
        for name, url in urls.items()
        if needs_direct_check(
            supervisor_answered=report is not None, posture=_model_posture(report, name)
        )
    }


def heartbeat_timeout(policy: Policy) -> float:
    """Bound a heartbeat well inside the staleness window, so a slow host reads as stale, not
    as a tick that never ends."""
    return max(0.5, min(CALL_CAP_S / 2, policy.heartbeat_stale_ms / 2000))


def heartbeats_collect(
    domains: list[Domain],
    *,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    serving_urls: dict[Any, dict[str, str]] | None = None,
) -> list[Beat]:
    """Ask every domain's supervisor for `/v1/status` (and GPU memory), concurrently.

    `serving_urls` (domain id -> model name -> serving URL, the active's): the model servers
    to ask directly when their supervisor cannot vouch for them (it is down, or it does not
    know their posture), so a dead supervisor never reads as dead models.
    """
    timeout = heartbeat_timeout(policy)
    direct_timeout = serving_check_timeout(policy)
    urls_of = serving_urls or {}

    def one(domain: Domain) -> Beat:
        observed = clock.now()
        if not domain.supervisor_url:
            return Beat(domain, observed, None)
        client: SupervisorClient = client_for(domain)
        gpu = _gpu_read_start(domain, client, timeout=timeout, now=observed)
        call = client.status(timeout=timeout)
        unvouched = _unvouched(call.value, urls_of.get(domain.id, {}))
        direct = servers_check(unvouched, timeout=direct_timeout) if unvouched else {}
        return Beat(domain, observed, call, gpu, direct)

    return list(_status_pool().map(one, domains))


def beat_one(
    domain: Domain,
    *,
    policy: Policy,
    client_for: Callable[[Domain], SupervisorClient],
    serving_urls: dict[str, str],
) -> Beat:
    """A targeted heartbeat of one domain: its supervisor and (always) its model servers,
    each bounded by the serving-check timeout (the data-path confirmation's round)."""
    timeout = serving_check_timeout(policy)
    observed = clock.now()
    if not domain.supervisor_url:
        return Beat(domain, observed, None, None, servers_check(serving_urls, timeout=timeout))
    status = _status_pool().submit(client_for(domain).status, timeout=timeout)
    direct = servers_check(serving_urls, timeout=timeout)
    return Beat(domain, observed, status.result(), None, direct)


def _gpu_read_start(
    domain: Domain, client: SupervisorClient, *, timeout: float, now: datetime
) -> GpuRead | None:
    """Start this domain's GPU memory read, or join the one still unstored; None if the stored
    answer is recent enough."""
    with _gpu_reads_lock:
        held = _gpu_reads.get(domain.id)
        if held is not None:
            return held  # still running (or answered after its beat was written): use that one
        if not _gpu_read_due(domain, now):
            return None
        read = GpuRead(now, _gpu_pool().submit(client.gpu_memory, timeout=timeout))
        _gpu_reads[domain.id] = read
        return read


def pending_gpu_read(domain_id: Id) -> GpuRead | None:
    """Return the domain's GPU memory read not yet stored, if any (tests wait on it)."""
    with _gpu_reads_lock:
        return _gpu_reads.get(domain_id)


def _gpu_read_due(domain: Domain, now: datetime) -> bool:
    """Whether to ask for GPU memory now: not while the heartbeat is failing (the status call
    says whether the host is there; no second call to a dead host), and not again within
    GPU_MEMORY_EVERY_MS of the last answer, good or bad."""
    if domain.heartbeat_failing_since is not None:
        return False
    last = domain.gpus_read_at
    if last is None:
        return True
    return not timedelta(0) <= now - last < timedelta(milliseconds=GPU_MEMORY_EVERY_MS)


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
    err = call.error
    if err is None and call.value is not None:
        return {"gpus": list(call.value.raw.get("gpus") or []), "gpusAt": asked_at}
    if err is None:
        return None  # a call carries a value or an error; never neither
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


def serving_urls_of(domain_id: Id | None) -> dict[str, str]:
    """Model name -> serving URL of a domain's bindings (empty for None)."""
    if domain_id is None:
        return {}
    return dict(ModelBinding.objects.filter(domain_id=domain_id).values_list("name", "serving_url"))


def _record_model_health(beat: Beat, report: StatusReport | None, actor: str) -> None:
    """Record each bound model's own server health from this beat (fleets.core.model_health).

    Written when it changes, and on every direct sighting of a live server: that sighting is
    what keeps a supervisor-less active from reading stale (`serving_seen_at`).
    """
    rows = ModelBinding.objects.filter(domain=beat.domain).values_list("id", "name", "health")
    for binding_id, name, current in rows:
        direct = beat.direct.get(name, Reach.NOT_ASKED)
        health = model_health(
            supervisor_answered=report is not None,
            posture=_model_posture(report, name),
            direct=direct,
        )
        if health is None or (health == current and direct == Reach.NOT_ASKED):
            continue
        if health == current and health != ServerHealth.UP:
            continue
        model_health_record(
            binding_id=binding_id,
            health=health,
            observed_at=beat.observed_at,
            source="direct" if direct != Reach.NOT_ASKED else "supervisor",
            actor=actor,
        )


def _record_engine_versions(beat: Beat, report: StatusReport | None, actor: str) -> None:
    """Keep each bound model's engine version as its supervisor reported it (ours reports it;
    the original does not, and an unreported version changes nothing)."""
    if report is None:
        return
    rows = ModelBinding.objects.filter(domain=beat.domain).values_list(
        "id", "name", "engine_version"
    )
    for binding_id, name, current in rows:
        reading = report.model(name)
        version = reading.engine_version if reading is not None else None
        if version and version != current:
            binding_engine_version_record(
                binding_id=binding_id,
                engine_version=version,
                observed_at=beat.observed_at,
                actor=actor,
            )


def heartbeat_apply(
    beat: Beat,
    *,
    active_domain_id: Id | None,
    operation_in_flight: bool,
    actor: str = "heartbeat",
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
    _record_model_health(beat, report, actor)
    _record_engine_versions(beat, report, actor)
    # Taken only now, after the state decisions: GPU memory never holds them up.
    gpu_fields = _gpu_fields(beat, domain.last_report)
    if report is not None:
        domain_seen(
            domain_id=domain.id,
            fleet_id=domain.fleet_id,
            seen_at=beat.observed_at,
            # The previous GPU keys are display data carried over from the row read at tick
            # start; the read's schedule is the gpus_read_at column.
            report=_with_gpus(report.raw, gpu_fields, domain.last_report),
            gpus_read_at=beat.gpu.asked_at if gpu_fields is not None and beat.gpu else None,
        )
    elif (err := beat.call.error) is not None:
        domain_heartbeat_failed(
            domain_id=domain.id,
            fleet_id=domain.fleet_id,
            checked_at=beat.observed_at,
            error={"kind": err.kind, "status": err.status, "message": err.message},
        )


def _model_posture(report: StatusReport | None, name: str) -> ModelPosture:
    reading = report.model(name) if report is not None else None
    if reading is None:
        return ModelPosture.MISSING
    if reading.sleeping is None:
        return ModelPosture.UNKNOWN
    return ModelPosture.ASLEEP if reading.sleeping else ModelPosture.AWAKE


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
    postures = [_model_posture(report, n) for n in names]
    result = inference_move(
        slot.state,
        postures,
        reachable=report is not None,
        is_active=is_active,
        settle_serving=settle_serving,
    )
    if result.to_state is not None:
        missing = [n for n, p in zip(names, postures, strict=True) if p == ModelPosture.MISSING]
        reason = (
            "supervisor unreachable"
            if report is None
            else (f"missing from status: {', '.join(missing)}" if missing else "reported posture")
        )
        slot_mirror(
            slot_id=slot.id,
            from_state=slot.state,
            to_state=result.to_state,
            observed_at=observed_at,
            now=now,
            reason=reason,
            actor=actor,
        )
    return result.in_posture


def _trainer_posture(reading: TrainingReport | None) -> TrainerPosture:
    if reading is None:
        return TrainerPosture.ABSENT
    if reading.running_with_pid:
        return TrainerPosture.RUNNING
    return TrainerPosture.IDLE if reading.state == TrainerReportState.IDLE else TrainerPosture.OTHER


def _mirror_training(
    slot: Slot, report: StatusReport, *, observed_at: datetime, now: datetime, actor: str
) -> None:
    reading = report.training(slot.gpu_index)
    posture = _trainer_posture(reading)
    pids = list(reading.pids) if reading is not None else []
    to_state = training_move(slot.state, posture)
    if to_state is not None:
        slot_mirror(
            slot_id=slot.id,
            from_state=slot.state,
            to_state=to_state,
            observed_at=observed_at,
            now=now,
            pids=pids if to_state == TrainingState.TRAINING else [],
            reason=(
                "trainer running" if to_state == TrainingState.TRAINING else "trainer not running"
            ),
            actor=actor,
        )
    elif (
        slot.state == TrainingState.TRAINING
        and posture == TrainerPosture.RUNNING
        and pids != slot.pids
    ):
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
    to_state = domain_move(
        domain.state, reachable=report is not None, is_active=is_active, in_posture=healthy
    )
    if to_state is None:
        return
    if report is None:
        reason = "heartbeat failed"
    elif healthy:
        reason = "heartbeat healthy"
    else:
        reason = "not every bound model is awake" if is_active else "model state unknown"
    domain_mirror(
        domain_id=domain.id,
        from_state=domain.state,
        to_state=to_state,
        observed_at=beat.observed_at,
        now=now,
        reason=reason,
    )
