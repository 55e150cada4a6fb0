"""One reconcile tick for one fleet.

0. read the fleet in one snapshot (`fleets.reads.tick_snapshot`: four statements); a quiet
   fleet (nothing in flight or pending, no operation recent enough for backoff, damping or a
   restore to look at) is heartbeated from it, a healthy standby only every
   `standbyHeartbeatMs` (`fleets.core.heartbeat_cadence`); when no beat moved a row or failed
   and the core's own answers on the snapshot find nothing to do below, the tick ends there,
   having written nothing but the lease (an idle tick: six statements with the lease; the
   good heartbeats that changed nothing are kept on the lease's give-back,
   `fleets.reads.sightings`);
1. heartbeat every domain's supervisor, concurrently (HTTP, outside any transaction; a quiet
   fleet's beats of step 0 stand for this one);
2. mirror slot health and domain states (the core plans each beat; one service call writes it);
3. escalate an active degraded past `degradedGraceMs` (every condition inside one UPDATE);
4. detect failover: a lost active pre-empts an in-flight operation that cannot lead to a
   serving domain (fleets.core.preemption: cancelled, or, for a promotion whose routing
   committed to the domain now lost, succeeded without its best-effort steps), then the
   promotion is requested (`reason="auto_failover"`), passing over standbys still backing off
   after failed attempts;
   with nothing in flight, restore a returned standby's posture, probe the active for golden
   baselines it has none of (rate-limited), then request a drill that is due;
5. advance the in-flight operation through every step that completes at once;
6. finish the clean-ups of failed or cancelled promotions and drills still pending (a cancel
   from the API, a pre-emption, or a worker that died right after a failure);
6b. the adapter pass (fleets/reconciler/adapters.py), only when something may have moved:
   a supervisor advertises `adapters` and a checkpoint or the adapter routes moved, the last
   pass left work, or its interval passed (remembered in memory: an idle tick reads nothing
   more for it);
7. look at the rollout in flight, if any (fleets/reconciler/rollout.py): a fleet with one is
   never quiet, its standby is neither restored nor drilled, and its serving candidate is not
   settled back to sleep by the heartbeat.

Steps 3 and 4 live in `fleets.reconciler.failover`. `tick_run` wraps it in the fleet's tick
lease; `fleet_tick` is the bare tick (safe to run concurrently: every write is a conditional
UPDATE; the race tests run it from 8 threads).

A process that is stopping (`fleets.base.stopping`: SIGTERM or SIGINT received) runs no tick,
and a tick running when the signal arrives stops at its next checkpoint: what a stopping
control plane sees (its hosts stopping with it, refusing connections) is never written as a
failure, and no operation is started. One in flight is left as it is, to resume after the
restart with the time the control plane was away taken off its step's clock (`_resume`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from fleets.base import clock, stopping
from fleets.base.errors import FleetNotFound, InvalidTarget, OperationConflict
from fleets.core.backoff import held_targets
from fleets.core.drills import DrillSchedule, drill_due
from fleets.core.failover import (
    RESTORE_RETRY_AFTER_MS,
    detect_failover,
    should_escalate,
    standby_to_restore,
)
from fleets.core.heartbeat_cadence import standby_beat_due
from fleets.core.provisioning import Phase
from fleets.core.read_model import FleetView
from fleets.core.states import (
    IN_FLIGHT_OPERATION_STATES,
    CleanupState,
    DomainState,
    InferenceState,
    OperationKind,
    OperationState,
    SlotKind,
)
from fleets.metrics import reconcile as fleet_metrics
from fleets.models import Domain, Fleet, Id, Operation
from fleets.reads import sightings as sightings_mod
from fleets.reads.selectors import (
    failover_backoff_state,
    failover_damping_state,
    fleet_get,
    fleet_view,
)
from fleets.reads.tick_snapshot import TickSnapshot, tick_snapshot
from fleets.reconciler import adapters, datapath, failover, kick
from fleets.reconciler.adapter_rollout import adapter_rollout_autostart
from fleets.reconciler.advance import operation_advance
from fleets.reconciler.golden import (
    BASELINE_PROBE_INTERVAL_MS,
    active_baselines_fill,
    missing_baselines,
    targets_from,
)
from fleets.reconciler.heartbeat import (
    Beat,
    binding_rows,
    heartbeat_apply,
    heartbeats_collect,
    serving_urls_of,
    slot_rows,
)
from fleets.reconciler.locks import LeaseLost, fleet_tick_lock, tick_lease_s
from fleets.reconciler.rollout import ArmReader, rollout_advance
from fleets.reconciler.steps.cleanup import pending_cleanups_run
from fleets.reconciler.supervisor.client import SupervisorClient, client_for
from fleets.services.operations import (
    operation_request,
)
from fleets.services.resume import operation_step_clock_resume

log = logging.getLogger(__name__)

# A tick starts no new step nudge after this long; a call already running finishes (each is
# capped at 10 s), so one tick stays well inside the Celery soft limit.
TICK_BUDGET_S = 5.0
# How long a waiting step is re-polled inside the tick before handing back with a nudge: short
# waits (a trainer saving its checkpoint) finish in the same tick without a new heartbeat round.
TICK_POLL_S = 2.0
# A skipped tick looks again this long after the holder's lease runs out: the wait is worked out
# on this host's clock from the deadline the take then compares with this host's clock, so the
# slack only covers a timer that fires a moment early (a take a moment early is skipped again,
# one statement). It is what a dead worker's fleets wait beyond its lease.
LEASE_RETRY_SLACK_MS = 50


@dataclass(frozen=True)
class TickResult:
    fleet_id: str
    ran: bool  # False: another tick held the fleet's lock
    operation_id: Id | None = None
    nudge_ms: int | None = None  # look again this soon (a step waits on the outside world)

    def operation(self) -> Operation | None:
        if self.operation_id is None:
            return None
        return Operation.objects.filter(pk=self.operation_id).first()


def _no_checkpoint() -> None:
    """A bare tick (tests, the race suite) has no lease to renew."""


def fleet_tick(
    *,
    fleet_id: Id,
    client_factory: Callable[[Domain], SupervisorClient] = client_for,
    budget_s: float = TICK_BUDGET_S,
    poll_s: float = TICK_POLL_S,
    actor: str = "reconciler",
    checkpoint: Callable[[], None] = _no_checkpoint,
    sightings: sightings_mod.Sightings | None = None,
    arm_reader: ArmReader | None = None,
    widen: Callable[[], None] = _no_checkpoint,
) -> TickResult:
    """Run one tick for one fleet without taking its lease (see `tick_run`).

    `checkpoint` is called between phases and steps; the lease's raises `LeaseLost` once this
    tick may no longer write (see `fleets.reconciler.locks`). Every checkpoint also raises
    `Stopping` once this process is stopping, before anything observed is written. `widen` is
    called once the tick leaves the quiet path, before anything that may call supervisors for
    longer than a heartbeat: the lease's holds it for its whole length from then on.
    `sightings`: the heartbeat sightings of the lease this tick holds (`tick_run`): read for
    every domain's freshness, and added to by the good beats that changed nothing, which then
    write no row. None (no lease): they are read, and such beats record their sighting on the
    row when it is due (`fleets.core.heartbeat_cadence`). `arm_reader`: what the rollout's
    gates read (fleets/reconciler/rollout.py; default: the proxies' per-arm records).
    """

    def gate() -> None:
        stopping.check()
        checkpoint()

    gate()
    snap = tick_snapshot(fleet_id, sightings)
    if snap is None:
        return TickResult(str(fleet_id), ran=True)
    fleet = snap.fleet
    view = snap.view
    policy = view.policy

    # 0. A quiet fleet (nothing in flight, no recent operation) is heartbeated from the
    # snapshot; when nothing it heard is news and the core finds nothing to do, the tick ends
    # there, having written nothing.
    quiet = _quiet_run(snap, client_factory, gate, sightings) if snap.quiet(clock.now()) else None
    checkpoints = adapters.checkpoints_of(quiet.beats) if quiet is not None else {}
    if quiet is not None and quiet.idle:

        def widened() -> None:  # the adapter pass copies and probes: longer calls
            widen()
            gate()

        _adapters_maybe(snap, client_factory, checkpoints, widened, actor)
        # A new adapter version probed on the active goes out on its own (no query for a fleet
        # without adapter routes).
        started = adapter_rollout_autostart(fleet=fleet, policy=policy, actor=actor)
        return TickResult(str(fleet.id), True, nudge_ms=0 if started else None)

    # The full path: supervisor calls up to their cap, operation steps.
    widen()

    # 1-2b. Heartbeats, then the confirmation of a suspected dead active.
    if quiet is None:
        # The full path's own beats say what the trainers completed: a fleet that is never
        # quiet (an operation lately, a rollout) must see a new adapter too.
        observed, in_flight, checkpoints = _heartbeats_run(
            fleet, view, client_factory, gate, actor, sightings, rollout=snap.open_rollout
        )
    else:
        observed, in_flight = quiet.observed, False
        _confirm(fleet, view, quiet.beats, in_flight, client_factory, gate, actor)

    # 3. Escalation: the core says whether it is due; the UPDATE re-checks it all.
    gate()
    now = observed
    view = failover.maybe_escalate(fleet, fleet_view(fleet, sightings), policy, now, actor)

    # 4. Failover: pre-empt what blocks it, detect, then (nothing else started) a returned
    # standby's posture. Standbys still backing off after failed attempts are passed over; a
    # fleet that failed over too often lately waits for its active to stay lost (damping).
    held = held_targets(failover_backoff_state(fleet.id, policy), now)
    damping = failover_damping_state(fleet.id, policy, now)
    gate()
    if in_flight:
        in_flight = not failover.maybe_preempt(fleet, view, now, held, damping, actor)
    if not in_flight and not failover.maybe_fail_over(fleet, view, now, held, damping, actor, gate):
        # None of this could start beside a failover, and the outage waits for its first step:
        # a failover requested just now goes straight to the advance below.
        gate()
        if damping is None and not snap.open_rollout:
            # Damped, a host that keeps coming back is left as it returned: restoring its
            # posture each time would restart its training each time.
            _maybe_restore_standby(fleet, now, actor)
        # Before a drill: its standby's wake is then judged against what the active serves.
        active_baselines_fill(fleet=fleet, policy=policy, client_for=client_factory, now=now)
        gate()
        if not snap.open_rollout:
            # The standby is the rollout's candidate: no drill beside it.
            _maybe_drill(fleet, now, actor)

    # 5. Advance whatever is in flight now (including a promotion created just above).
    advance = operation_advance(
        fleet_id=fleet.id,
        client_for=client_factory,
        budget_s=budget_s,
        poll_s=poll_s,
        actor=actor,
        checkpoint=gate,
    )

    # 6. Clean-ups left pending; after the advance, so a failover never waits behind them.
    gate()
    pending_cleanups_run(fleet_id=fleet.id, policy=policy, client_for=client_factory, actor=actor)

    # 6b. Adapters: registered, copied, loaded and probed (fleets/reconciler/adapters.py).
    _adapters_maybe(snap, client_factory, checkpoints, gate, actor)

    # 7. The rollout in flight, one look further (after the failover and its operation).
    nudge = advance.nudge_ms
    if snap.open_rollout:
        gate()
        look = rollout_advance(
            fleet_id=fleet.id, client_for=client_factory, actor=actor, arm_reader=arm_reader
        )
        if look is not None and look.nudge_ms is not None:
            nudge = look.nudge_ms if nudge is None else min(nudge, look.nudge_ms)
    elif adapter_rollout_autostart(fleet=fleet, policy=policy, actor=actor) is not None:
        nudge = 0
    return TickResult(str(fleet.id), True, advance.operation_id, nudge)


def _adapters_maybe(
    snap: TickSnapshot,
    client_factory: Callable[[Domain], SupervisorClient],
    checkpoints: dict[str, str | None],
    checkpoint: Callable[[], None],
    actor: str,
) -> None:
    """The adapter pass, when something may have moved (in memory: no statement otherwise)."""
    fleet = snap.fleet
    if not adapters.adapters_due(
        fleet_id=fleet.id,
        route_revision=fleet.route_revision,
        supervisor_urls=[d.supervisor_url for d in snap.domains],
        checkpoints=checkpoints,
        routes=bool(fleet.adapter_routes),
    ):
        return
    checkpoint()
    adapters.adapters_pass(
        fleet_id=fleet.id,
        policy=snap.policy,
        client_for=client_factory,
        checkpoints=checkpoints,
        actor=actor,
    )


def _heartbeats_run(
    fleet: Fleet,
    view: FleetView,
    client_factory: Callable[[Domain], SupervisorClient],
    checkpoint: Callable[[], None],
    actor: str,
    sightings: sightings_mod.Sightings | None = None,
    *,
    rollout: bool = False,
) -> tuple[datetime, bool, dict[str, str | None]]:
    """Heartbeat every domain (read all, then apply each), then confirm a suspected dead
    active; return the round's observation time, whether an operation is in flight, and what
    each domain's trainer last completed (`lastAdapterAt`, for the adapter pass).
    `rollout`: a rollout is in flight, and its candidate standby serves: its serving slot is
    not settled to sleeping (or failed) as a standby left awake would be."""
    policy = view.policy
    # The active's model servers are asked directly when its supervisor cannot vouch for them.
    # Each domain's last good heartbeat takes the lease's sighting in: a failure is dated from
    # it (`heartbeat_apply`).
    domains = list(Domain.objects.filter(fleet=fleet))
    if sightings is None:
        sightings_mod.overlaid(domains, [fleet.id])
    else:
        sightings_mod.overlay(domains, sightings)
    routed_id = view.active_domain_id
    beats = heartbeats_collect(
        domains,
        policy=policy,
        client_for=client_factory,
        serving_urls={d.id: serving_urls_of(d.id) for d in domains if str(d.id) == routed_id},
    )
    # Liveness is judged as of this round's observation: the moment its answers were in, on
    # this clock, before any database write. A database that stalls the writes below (a held
    # write lock, a long transaction) delays the tick but cannot age a heartbeat that was just
    # answered into a stale one (issue 11, finding 6).
    observed = clock.now()
    in_flight = Operation.objects.filter(
        fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
    ).exists()
    active_id = Fleet.objects.filter(pk=fleet.id).values_list("active_domain_id", flat=True).get()
    for beat in beats:
        checkpoint()  # a slow database can make these writes outlast a lease
        heartbeat_apply(beat, active_domain_id=active_id, operation_in_flight=in_flight or rollout)

    _confirm(fleet, view, beats, in_flight, client_factory, checkpoint, actor, active_id)
    return observed, in_flight, adapters.checkpoints_of(beats)


def _confirm(
    fleet: Fleet,
    view: FleetView,
    beats: list[Beat],
    in_flight: bool,
    client_factory: Callable[[Domain], SupervisorClient],
    checkpoint: Callable[[], None],
    actor: str,
    active_id: Id | None = None,
) -> None:
    """Confirm a suspected dead active (a proxy's report, or this beat's refusals) now with
    targeted heartbeats instead of waiting out the stale window."""
    if active_id is None:
        active_id = fleet.active_domain_id
    active_beat = next((b for b in beats if b.domain.id == active_id), None)
    if active_beat is not None and not in_flight:
        datapath.confirm_active(
            fleet_id=fleet.id,
            active=active_beat.domain,
            tick_beat=active_beat,
            policy=view.policy,
            client_for=client_factory,
            operation_in_flight=in_flight,
            actor=actor,
            checkpoint=checkpoint,
        )


@dataclass(frozen=True)
class QuietRound:
    """A quiet fleet's heartbeat round: what it heard, and whether the tick can end there."""

    observed: datetime
    beats: list[Beat]
    idle: bool


def _quiet_run(
    snap: TickSnapshot,
    client_factory: Callable[[Domain], SupervisorClient],
    checkpoint: Callable[[], None],
    sightings: sightings_mod.Sightings | None = None,
) -> QuietRound:
    """Heartbeat a quiet fleet from its snapshot (no read of its own; a healthy standby only
    when due), write what is due, and tell whether the rest of the tick has anything to do: not
    when a beat moved a row or failed (a sighting kept or recorded decides nothing).
    `sightings`: the tick lease's, where a beat that changed nothing keeps its sighting."""
    view, policy = snap.view, snap.policy
    now = clock.now()
    active = view.active
    active_ready = active is not None and active.state == DomainState.READY
    # A standby is healthy here when it is ready, answering, and in standby posture (every
    # model server asleep, no slot failed): anything else is asked every tick.
    unsettled = {
        s.domain_id
        for s in snap.slots
        if s.state == InferenceState.FAILED
        or (s.kind == SlotKind.INFERENCE and s.state != InferenceState.SLEEPING)
    }
    asked = [
        d
        for d in snap.domains
        if str(d.id) == view.active_domain_id
        or standby_beat_due(
            last_seen_at=d.last_seen_at,
            healthy=active_ready
            and d.state == DomainState.READY
            and d.heartbeat_failing_since is None
            and d.id not in unsettled,
            now=now,
            policy=policy,
        )
    ]
    urls = {
        b.name: b.serving_url for b in snap.bindings if str(b.domain_id) == view.active_domain_id
    }
    beats = heartbeats_collect(
        asked,
        policy=policy,
        client_for=client_factory,
        serving_urls={d.id: urls for d in asked if str(d.id) == view.active_domain_id},
        operation_in_flight=False,
    )
    observed = clock.now()
    news = False
    for beat in beats:
        checkpoint()  # a slow database can make these writes outlast a lease
        domain_id = beat.domain.id
        news |= heartbeat_apply(
            beat,
            active_domain_id=snap.fleet.active_domain_id,
            operation_in_flight=False,
            slots=slot_rows([s for s in snap.slots if s.domain_id == domain_id]),
            bindings=binding_rows([b for b in snap.bindings if b.domain_id == domain_id]),
            policy=policy,
            sightings=sightings,
        )
    idle = not news and active_ready and _nothing_to_do(snap, observed)
    return QuietRound(observed, beats, idle)


def _nothing_to_do(snap: TickSnapshot, now: datetime) -> bool:
    """Whether steps 3 to 6 would find nothing to do on a quiet fleet whose beats were no news:
    the core's own answers on the snapshot (no escalation, no failover, no standby to restore,
    no drill due), no data-path suspicion, no no-standby report to clear, no baseline missing."""
    fleet, view = snap.fleet, snap.view
    active = view.active
    if active is None or fleet.no_standby_reported_at is not None:
        return False
    if datapath.first_failed_at(fleet.id, active.id) is not None:
        return False
    if should_escalate(view, now, active.state_since):
        return False
    if detect_failover(view, now, {}, None, None) is not None:
        return False
    unsettled = frozenset(
        str(d.id)
        for d in snap.domains
        if (d.driver_status or {}).get("phase") not in ("", None, Phase.SETTLED)
    )
    if view.policy.restore_standby_on_return and standby_to_restore(view, now, {}, unsettled):
        return False
    schedule = DrillSchedule(
        fleet.drill_interval_minutes, fleet.drill_window_start, fleet.drill_window_end
    )
    if schedule.enabled and drill_due(schedule, snap.last_drill_at, now):
        return False
    return _baselines_settled(snap, now)


# Fleet id -> (what decides whether its active's baselines are complete, whether they were), as
# last checked by this process. Bounded: past the bound it is emptied, and each fleet's next
# tick checks again (one more read).
_baseline_checks: dict[str, tuple[tuple, bool]] = {}
_BASELINE_CHECKS_MAX = 10_000


def _baselines_settled(snap: TickSnapshot, now: datetime) -> bool:
    """Whether the baseline pass would do nothing: the active has every golden baseline it can
    have, or the fleet's turn to probe for the missing ones is not due yet. Completeness is
    checked against the database once per change of what decides it (the active's bindings,
    the fleet's baselines, the probe request), then remembered."""
    fleet, policy = snap.fleet, snap.policy
    active_id = fleet.active_domain_id
    bindings = sorted((b for b in snap.bindings if b.domain_id == active_id), key=lambda b: b.name)
    key = (
        str(active_id),
        snap.baselines,
        policy.probe_prompt,
        policy.probe_max_tokens,
        tuple((b.id, b.name, b.engine_version, repr(b.profile), repr(b.golden)) for b in bindings),
    )
    checked = _baseline_checks.get(str(fleet.id))
    if checked is not None and checked[0] == key:
        complete = checked[1]
    else:
        complete = not missing_baselines(fleet.id, targets_from(bindings), policy)
        if len(_baseline_checks) >= _BASELINE_CHECKS_MAX:
            _baseline_checks.clear()
        _baseline_checks[str(fleet.id)] = (key, complete)
    if complete:
        return True
    last = fleet.baseline_probe_at
    return last is not None and timedelta(0) <= now - last < timedelta(
        milliseconds=BASELINE_PROBE_INTERVAL_MS
    )


def _maybe_drill(fleet: Fleet, now: datetime, actor: str) -> None:
    """Request the scheduled drill when it is due; a refusal (something degraded, an operation
    in flight, no viable standby) just waits for a later tick inside the window."""
    schedule = DrillSchedule(
        fleet.drill_interval_minutes, fleet.drill_window_start, fleet.drill_window_end
    )
    if not schedule.enabled:
        return
    last = (
        Operation.objects.filter(fleet_id=fleet.id, kind=OperationKind.DRILL)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if not drill_due(schedule, last, now):
        return
    try:
        operation_request(
            fleet=fleet,
            kind=OperationKind.DRILL,
            target_domain_id=None,
            actor=actor,
            reason="scheduled_drill",
            drill_mode=fleet.drill_mode,
        )
    except (OperationConflict, InvalidTarget) as exc:
        # Debug: while the fleet is degraded this repeats on every tick of the window.
        log.debug("fleet %s: scheduled drill not started: %s", fleet.slug, exc)


def _maybe_restore_standby(fleet: Fleet, now: datetime, actor: str) -> None:
    if Operation.objects.filter(fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES).exists():
        return
    since = now - timedelta(milliseconds=RESTORE_RETRY_AFTER_MS)
    failed = Operation.objects.filter(
        fleet_id=fleet.id,
        kind=OperationKind.DEMOTE,
        state=OperationState.FAILED,
        finished_at__gte=since,
    ).values_list("target_domain_id", "finished_at")
    last_failed: dict[str, datetime] = {}
    for domain_id, finished_at in failed:
        key = str(domain_id)
        if finished_at is not None:  # the filter says so; the type does not
            last_failed[key] = max(finished_at, last_failed.get(key, finished_at))
    # A node Haru launched is settled into standby posture by the provisioning pass (its phase
    # is "up" until then); restoring it here too would race that pass for the same demotion.
    # Likewise a failed promotion's target whose clean-up is still pending: that clean-up is
    # the same demotion.
    unsettled = frozenset(
        str(pk)
        for pk, status in Domain.objects.filter(fleet_id=fleet.id)
        .exclude(driver_status={})
        .values_list("id", "driver_status")
        if (status or {}).get("phase") not in ("", None, Phase.SETTLED)
    ) | frozenset(
        str(pk)
        for pk in Operation.objects.filter(
            fleet_id=fleet.id, cleanup=CleanupState.PENDING
        ).values_list("target_domain_id", flat=True)
        if pk is not None
    )
    target = standby_to_restore(fleet_view(fleet), now, last_failed, unsettled)
    if target is None:
        return
    try:
        result = operation_request(
            fleet=fleet,
            kind=OperationKind.DEMOTE,
            target_domain_id=target.id,
            actor=actor,
            reason="restore_standby",
        )
    except (OperationConflict, InvalidTarget) as exc:
        log.info("fleet %s: standby posture not restored: %s", fleet.slug, exc)
        return
    if result.created:
        log.warning("fleet %s: %s is back but awake; demoting it", fleet.slug, target.slug)


def tick_run(
    *,
    fleet_id: Id,
    wait_s: float = 0.0,
    client_factory: Callable[[Domain], SupervisorClient] = client_for,
    budget_s: float = TICK_BUDGET_S,
    poll_s: float = TICK_POLL_S,
    actor: str = "reconciler",
    periodic_s: float | None = None,
) -> TickResult:
    """Run one tick under the fleet's lease; skip (ran=False) if another tick holds it.

    A skipped tick says when the holder's lease runs out (`nudge_ms`), so the driver looks again
    then: a holder that was killed or frozen is taken over one lease later, not one beat later.
    `periodic_s`: this is a loop's periodic tick at that interval; a fleet another worker
    ticked a moment ago is skipped too, with `nudge_ms` one interval after that tick
    (fleets/core/dispatch.py `PERIODIC_SKIP_SHARE`).
    A process that is stopping runs none (ran=False), and one that it interrupts ends there.
    """
    started = time.monotonic()
    if stopping.is_stopping():
        fleet_metrics.TICKS.labels(outcome="stopping").inc()
        return TickResult(str(fleet_id), ran=False)
    with fleet_tick_lock(fleet_id, wait_s=wait_s, periodic_s=periodic_s) as lease:
        if not lease:
            fleet_metrics.TICKS.labels(outcome="skipped").inc()
            retry = lease.retry_in_s
            nudge = None if retry is None else int(retry * 1000) + LEASE_RETRY_SLACK_MS
            return TickResult(str(fleet_id), ran=False, nudge_ms=nudge)
        if lease.taken_over_from:
            fleet_metrics.TICKS.labels(outcome="taken_over").inc()
        try:
            stopping.check()
            _resume(fleet_id, lease.last_held_at, actor)
            result = fleet_tick(
                fleet_id=fleet_id,
                client_factory=client_factory,
                budget_s=budget_s,
                poll_s=poll_s,
                actor=actor,
                checkpoint=lease.check,
                sightings=lease.sightings_for_tick(),
                widen=lease.widen,
            )
        except LeaseLost as exc:
            # Another worker took the fleet over while this one was frozen or slow: it owns
            # the fleet now, and this tick stops without another write.
            log.warning("fleet %s: tick stopped: %s", fleet_id, exc)
            fleet_metrics.TICKS.labels(outcome="lease_lost").inc()
            return TickResult(str(fleet_id), ran=False)
        except stopping.Stopping:
            # What this tick saw after the stop began (hosts stopping with it) is not written.
            log.info("fleet %s: tick stopped: this process is stopping", fleet_id)
            fleet_metrics.TICKS.labels(outcome="stopping").inc()
            return TickResult(str(fleet_id), ran=False)
        except Exception:
            fleet_metrics.TICKS.labels(outcome="error").inc()
            raise
    fleet_metrics.TICKS.labels(outcome="ok").inc()
    fleet_metrics.TICK_DURATION.observe(time.monotonic() - started)
    return result


def _resume(fleet_id: Id, last_held_at: datetime | None, actor: str) -> None:
    """Take the control plane's absence off the in-flight step's clock, if it was away.

    Away: nobody held the fleet's tick lease for longer than the lease itself lasts, the same
    silence after which a holder counts as gone. A live control plane re-ticks a fleet with an
    operation in flight within its nudge (a second at most) or interval, so that never happens
    while one runs.
    """
    away_ms = operation_step_clock_resume(
        fleet_id=fleet_id,
        last_held_at=last_held_at,
        now=clock.now(),
        away_after=timedelta(seconds=tick_lease_s()),
        actor=actor,
    )
    if away_ms:
        log.warning(
            "fleet %s: no control plane held it for %.1f s; the operation in flight resumes "
            "with that time off its step's clock",
            fleet_id,
            away_ms / 1000,
        )


def fleets_to_reconcile(selection: list[str] | None = None) -> list[str]:
    """Return the ids of the fleets to tick: all of them, or those named (slug or UUID)."""

    if not selection:
        return [str(pk) for pk in Fleet.objects.values_list("id", flat=True)]
    out = []
    for ref in selection:
        try:
            out.append(str(fleet_get(ref).id))
        except FleetNotFound:
            log.warning("reconcile: fleet %r not found; skipped", ref)
    return out


# How long `POST .../reconcile` waits for a running tick before saying it skipped.
RECONCILE_WAIT_S = 10.0


def fleet_reconcile(*, fleet_id: Id, actor: str = "api", wait_s: float | None = None) -> TickResult:
    """Run one tick now (the API's `POST .../reconcile`), waiting briefly for a running one.

    If a step still waits on the outside world afterwards, the process's tick driver (loop or
    Celery) is asked to look again soon.
    """

    wait = RECONCILE_WAIT_S if wait_s is None else wait_s
    result = tick_run(fleet_id=fleet_id, wait_s=wait, actor=actor)
    if result.nudge_ms is not None:
        kick.fleet_kick(result.fleet_id, delay_ms=result.nudge_ms)
    if result.operation_id is None:
        # Skipped, or nothing moved: report what is in flight, if anything.
        current = Operation.objects.filter(
            fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES
        ).first()
        if current is not None:
            return TickResult(result.fleet_id, result.ran, current.id, result.nudge_ms)
    return result
