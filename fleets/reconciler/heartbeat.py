"""Heartbeats: ask every domain's supervisor for its status, then mirror what it says.

Reading happens first, for all domains at once (threads, no database, no transaction). Then,
per domain, the pure core decides every move of the beat at once (`fleets.core.beat_plan`:
slots, domain, model health, engine versions, what the domain row records) and one service call
writes the plan (`fleets.services.heartbeats.heartbeat_record`), one conditional UPDATE per
change. Only steady-state pairs are mirrored; the in-between states (waking, probing, stopping)
belong to the operation step that set them. last_seen_at moves only after the slots were
mirrored, and only on a good heartbeat.

GPU memory (`GET /v1/gpu/memory`) is asked for beside the status, on its own pool, and is
display data only: nothing decides on it and nothing waits for it. A beat stores the answer if
it is in by the time the beat is planned; a slower one is stored by the next beat (one read
per domain in flight at a time, so a hung NVML cannot pile up threads). The report carries it as
`gpus` (read into the report model) and `gpusAt` (when it was asked); a 501 (no GPU facts on
that host) drops `gpus`; any other failure keeps the previous `gpus` and `gpusAt` and notes
`gpusError` (`fleets.core.beat_plan.gpu_keys`). Reads are spaced by GPU_MEMORY_EVERY_MS per
domain (GPU_MEMORY_IDLE_EVERY_MS with nothing in flight; from the later of the stored answer's
time and when this process last asked), and skipped while the domain's heartbeat is failing
(`fleets.core.heartbeat_cadence`).

An idle fleet's beats write nothing (`fleets.core.heartbeat_cadence`): a good beat that moves
nothing and brings the report already stored writes no row; under the tick lease its sighting
is kept on the lease's give-back (`fleets.reads.sightings`), without one it is recorded once the
stored one is a third of `heartbeatStaleMs` old. A healthy standby is asked only every
`standbyHeartbeatMs`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleets.base import clock
from fleets.core import heartbeat_cadence
from fleets.core.beat_plan import (
    BindingRow,
    GpuAnswer,
    Heard,
    SlotRow,
    beat_plan,
    model_posture,
)
from fleets.core.model_health import Reach, Verdict, needs_direct_check, unreachable_verdict
from fleets.core.policy import Policy
from fleets.core.report import DomainReport, GpuMemory, ReadError, StatusReport, read_report
from fleets.models import Domain, Id, ModelBinding, Slot
from fleets.reads import sightings as sightings_mod
from fleets.reconciler.supervisor.client import SupervisorClient, gpu_facts_unavailable
from fleets.reconciler.supervisor.transport import (
    CALL_CAP_S,
    Call,
    CallError,
    call_reach,
    serving_reach,
)
from fleets.services.heartbeats import heartbeat_record

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
GPU_MEMORY_EVERY_MS = heartbeat_cadence.GPU_MEMORY_EVERY_MS
GPU_MEMORY_IDLE_EVERY_MS = heartbeat_cadence.GPU_MEMORY_IDLE_EVERY_MS
# With nothing in flight, how long a beat that records waits for its GPU memory answer (a hung
# NVML costs an idle beat this much, once per record).
GPU_IDLE_WAIT_S = 0.25


@dataclass(frozen=True)
class GpuRead:
    """One `GET /v1/gpu/memory` in flight (or answered): when it was asked, and its answer."""

    asked_at: datetime
    future: Future  # of Call[GpuMemory]


# Domain id -> its read not yet stored: at most one per domain in this process.
_gpu_reads: dict[Any, GpuRead] = {}
_gpu_reads_lock = threading.Lock()
# Domain id -> when this process last asked for its GPU memory: an idle reading that matches
# the stored one is not written (`gpus_read_at` stays), so the pace is kept here too. Bounded
# like the fleets; a worker that takes a fleet over reads once more.
_gpu_asked: dict[Any, datetime] = {}
_GPU_ASKED_MAX = 20_000


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
            supervisor_answered=report is not None, posture=model_posture(report, name)
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
    operation_in_flight: bool = True,
) -> list[Beat]:
    """Ask every domain's supervisor for `/v1/status` (and GPU memory), concurrently.

    `serving_urls` (domain id -> model name -> serving URL, the active's): the model servers
    to ask directly when their supervisor cannot vouch for them (it is down, or it does not
    know their posture), so a dead supervisor never reads as dead models.
    `operation_in_flight`: GPU memory is then read at its own pace, not only with a beat that
    records its sighting (`fleets.core.heartbeat_cadence.gpu_read_due`).
    """
    timeout = heartbeat_timeout(policy)
    direct_timeout = serving_check_timeout(policy)
    urls_of = serving_urls or {}

    def one(domain: Domain) -> Beat:
        observed = clock.now()
        if not domain.supervisor_url:
            return Beat(domain, observed, None)
        client: SupervisorClient = client_for(domain)
        gpu = _gpu_read_start(
            domain, client, timeout=timeout, now=observed, in_flight=operation_in_flight
        )
        call = client.status(timeout=timeout)
        if gpu is not None and not operation_in_flight:
            # Idle, a brief wait lets this beat store a reading that changed, instead of the
            # next beat (a tick later) writing the row for it.
            futures.wait([gpu.future], timeout=GPU_IDLE_WAIT_S)
        unvouched = _unvouched(call.value, urls_of.get(domain.id, {}))
        direct = servers_check(unvouched, timeout=direct_timeout) if unvouched else {}
        return Beat(domain, observed, call, gpu, direct)

    if len(domains) == 1:
        # Nothing to run beside it (an idle tick that asks only the active): handing it to a
        # pool thread and waiting would cost two thread switches and buy nothing.
        return [one(domains[0])]
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
    domain: Domain,
    client: SupervisorClient,
    *,
    timeout: float,
    now: datetime,
    in_flight: bool = True,
) -> GpuRead | None:
    """Start this domain's GPU memory read, or join the one still unstored; None if the stored
    answer is recent enough."""
    with _gpu_reads_lock:
        held = _gpu_reads.get(domain.id)
        if held is not None:
            return held  # still running (or answered after its beat was written): use that one
        if not _gpu_read_due(domain, now, in_flight=in_flight):
            return None
        read = GpuRead(now, _gpu_pool().submit(client.gpu_memory, timeout=timeout))
        _gpu_reads[domain.id] = read
        if len(_gpu_asked) >= _GPU_ASKED_MAX:
            _gpu_asked.clear()
        _gpu_asked[domain.id] = now
        return read


def pending_gpu_read(domain_id: Id) -> GpuRead | None:
    """Return the domain's GPU memory read not yet stored, if any (tests wait on it)."""
    with _gpu_reads_lock:
        return _gpu_reads.get(domain_id)


def _gpu_read_due(domain: Domain, now: datetime, *, in_flight: bool) -> bool:
    """Whether to ask for GPU memory now: not while the heartbeat is failing (the status call
    says whether the host is there; no second call to a dead host), and not again within
    GPU_MEMORY_EVERY_MS (idle: GPU_MEMORY_IDLE_EVERY_MS) of the last answer stored, good or
    bad, or of this process's last read. Called with `_gpu_reads_lock` held."""
    if domain.heartbeat_failing_since is not None:
        return False
    asked = sightings_mod.later(domain.gpus_read_at, _gpu_asked.get(domain.id))
    if asked is not None and asked > now:
        asked = domain.gpus_read_at  # this process's clock moved back (a test's): the row rules
    return heartbeat_cadence.gpu_read_due(asked, now, in_flight=in_flight)


def _gpu_answer(beat: Beat) -> GpuAnswer | None:
    """Take this beat's GPU memory answer, or None if none came in.

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
    if call.error is None:
        return GpuAnswer(read.asked_at, memory=call.value)
    return GpuAnswer(
        read.asked_at,
        error=_read_error(call.error),
        unavailable=gpu_facts_unavailable(call.error),
    )


def _read_error(error: CallError) -> ReadError:
    return ReadError(kind=error.kind, message=error.message, status=error.status)


def serving_urls_of(domain_id: Id | None) -> dict[str, str]:
    """Model name -> serving URL of a domain's bindings (empty for None)."""
    if domain_id is None:
        return {}
    return dict(ModelBinding.objects.filter(domain_id=domain_id).values_list("name", "serving_url"))


def slot_rows(slots: list[Slot]) -> list[SlotRow]:
    return [SlotRow(s.id, s.kind, s.state, s.gpu_index, tuple(s.pids or ())) for s in slots]


def binding_rows(bindings: list[ModelBinding]) -> list[BindingRow]:
    return [BindingRow(b.id, b.slot_id, b.name, b.health, b.engine_version) for b in bindings]


def heartbeat_apply(
    beat: Beat,
    *,
    active_domain_id: Id | None,
    operation_in_flight: bool,
    actor: str = "heartbeat",
    slots: list[SlotRow] | None = None,
    bindings: list[BindingRow] | None = None,
    policy: Policy | None = None,
    sightings: sightings_mod.Sightings | None = None,
) -> bool:
    """Mirror one heartbeat: read the rows it may move, let the core plan every move
    (`fleets.core.beat_plan`), and hand the plan to the one service call that writes it.

    `slots` and `bindings`: the domain's rows as the tick already read them (read here when
    not given). `policy`: an unchanged good beat writes no row (`fleets.core.heartbeat_cadence`):
    its sighting goes to `sightings` (the tick lease's, written with its give-back) when given,
    else it is recorded on the row only when due; without a policy every good beat records it.
    Returns whether the beat was news: a move of any row, or a failure (a sighting recorded is
    not).
    """
    domain = beat.domain
    if beat.call is None:
        return False  # nothing to ask: a domain without a supervisor is never heartbeat-managed
    now = clock.now()
    if slots is None:
        slots = slot_rows(list(Slot.objects.filter(domain=domain)))
    if bindings is None:
        bindings = [
            BindingRow(*row)
            for row in ModelBinding.objects.filter(domain=domain).values_list(
                "id", "slot_id", "name", "health", "engine_version"
            )
        ]
    call = beat.call
    heard = Heard(
        observed_at=beat.observed_at,
        status=call.value if call.ok else None,
        error=_read_error(call.error) if call.error is not None else None,
        direct=beat.direct,
        gpu=_gpu_answer(beat),
    )
    plan = beat_plan(
        domain_id=domain.id,
        fleet_id=domain.fleet_id,
        domain_state=domain.state,
        # The previous GPU memory is display data carried over from the row read at tick
        # start; the read's schedule is the gpus_read_at column.
        stored=_stored_report(domain),
        slots=slots,
        bindings=bindings,
        heard=heard,
        is_active=domain.id == active_domain_id,
        settle_serving=not operation_in_flight,
        now=now,
    )
    if policy is not None:
        plan = heartbeat_cadence.sighting_dropped(
            plan,
            stored_report=domain.last_report,
            failing=domain.heartbeat_failing_since is not None,
            last_seen_at=domain.last_seen_at,
            policy=policy,
            kept_elsewhere=sightings is not None,
        )
    moves = heartbeat_cadence.has_moves(plan)
    if plan.seen is None and not moves:
        _unrecorded_note(domain.id, plan.observed_at)
        if sightings is not None:
            sightings_mod.note(sightings, domain.id, plan.observed_at)
        return False
    heartbeat_record(
        plan=plan,
        actor=actor,
        # The domain's `last_seen_at` as the tick read it takes the lease's sighting in
        # (`fleets.reads.sightings.overlay`): a failure dates the outage from the last good
        # beat any process heard, not from the last one written on the row.
        seen_before=sightings_mod.later(_unrecorded_take(domain.id), domain.last_seen_at),
        # The failure state read with the domain: the sighting's compare-and-swap.
        failing_since=domain.heartbeat_failing_since,
    )
    return moves


# Domain id -> (the stored report as the snapshot read it, read into the model): the tick
# snapshot hands back the same JSON object while the row is unchanged
# (`fleets.reads.tick_snapshot`), so an idle domain's report is read once, not every beat.
_stored: dict[Any, tuple[Any, DomainReport]] = {}
_STORED_MAX = 20_000


def _stored_report(domain: Domain) -> DomainReport:
    raw = domain.last_report
    held = _stored.get(domain.id)
    if held is not None and held[0] is raw:
        return held[1]
    report = read_report(raw)
    if len(_stored) >= _STORED_MAX:
        _stored.clear()
    _stored[domain.id] = (raw, report)
    return report


# Domain id -> this process's last good sighting that was not recorded (an unchanged beat):
# written with the next record of that domain, so a failure records when the host was last
# heard (the outage's honest start), not the older sighting stored. Bounded like the fleets.
_unrecorded: dict[Any, datetime] = {}
_unrecorded_lock = threading.Lock()
_UNRECORDED_MAX = 20_000


def _unrecorded_note(domain_id: Id, observed_at: datetime) -> None:
    with _unrecorded_lock:
        if len(_unrecorded) >= _UNRECORDED_MAX:
            _unrecorded.clear()
        held = _unrecorded.get(domain_id)
        _unrecorded[domain_id] = observed_at if held is None else max(held, observed_at)


def _unrecorded_take(domain_id: Id) -> datetime | None:
    with _unrecorded_lock:
        return _unrecorded.pop(domain_id, None)
