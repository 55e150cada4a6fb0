"""The promotion's step executors, in order (fleets.core.states.PROMOTE_STEPS).

stop_training, verify_gpu, wake and probe act on the target and fail the operation on a
definitive refusal; switch_route moves the pointer; demote_old_sleep and demote_old_train act on
the old active (the operation's recorded source) and never fail the operation.
"""

from __future__ import annotations

from typing import Any

from fleets.base import clock
from fleets.base.continuation_series import streams_continued_mark
from fleets.core.golden import PROBE_MISMATCH, BaselineReason, Verdict
from fleets.core.model_health import ServerHealth
from fleets.core.outage import during_outage
from fleets.core.report import (
    StatusReport,
    TrainerReportState,
    TrainingReport,
    stop_answer_trainers,
)
from fleets.core.states import (
    InferenceState,
    OperationState,
    Step,
    TrainingState,
    on_leg_of,
    steps_for,
)
from fleets.core.stream_migration import DrainBound, drain_bound, engine_of
from fleets.models import Event, Fleet, ModelBinding, Operation, Slot
from fleets.reconciler import golden
from fleets.reconciler.steps import posture
from fleets.reconciler.steps.base import (
    CAS_LOST,
    INSUFFICIENT_GPU_MEMORY,
    NO_INFERENCE_BINDINGS,
    NO_SUPERVISOR,
    PROBE_FAILED,
    RETRY_FAST_MS,
    Executor,
    StepContext,
    StepResult,
    bound_inference,
    done,
    failed,
    pending,
    percent,
    supervisor_trouble,
    switch_settle_ms,
    training_slots,
)
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.services.baselines import baseline_record
from fleets.services.model_health import model_health_record
from fleets.services.route_pointer import route_switch


def _target_client(ctx: StepContext) -> SupervisorClient | None:
    target = ctx.target
    if not target.supervisor_url:
        return None
    return ctx.client_for(target)


def _no_supervisor(ctx: StepContext) -> StepResult:
    return failed(NO_SUPERVISOR, f"domain {ctx.target.slug} has no supervisor URL")


def stop_training(ctx: StepContext) -> StepResult:
    """Stop every training slot of the target; done when the supervisor reports all idle."""
    target, op = ctx.target, ctx.operation
    slots = training_slots(target)
    if not slots:
        return done(trainingSlots=0)
    client = _target_client(ctx)
    if client is None:
        return _no_supervisor(ctx)
    claimed = False
    for slot in slots:
        if slot.state == TrainingState.TRAINING:
            # Claim the slots first, so heartbeats leave them to this step.
            claimed |= ctx.slot_move(
                slot,
                TrainingState.STOPPING,
                {TrainingState.TRAINING},
                "promotion: stopping training",
            )
    source = op.source_domain
    grace_ms = ctx.policy.training_stop_grace(
        outage=during_outage(
            kind=op.kind,
            detected_at=op.detected_at,
            source_state=source.state if source is not None else None,
        )
    )
    trainers: dict[int, TrainingReport] = {}
    if claimed:
        # First pass: ask at once, then look (saves a round trip on the failover's path).
        stop = client.training_stop(grace_ms=grace_ms, timeout=ctx.call_timeout())
        if stop.unauthorized:
            return supervisor_trouble(stop, on_target=True, what="training stop")
        # Ours answers with every trainer's state after the stop, and a failover's stop once
        # the trainer is gone: no status read then (the original's answer lists none).
        trainers = stop_answer_trainers(stop.value)
    if not {slot.gpu_index for slot in slots} <= trainers.keys():
        status = client.status(timeout=ctx.call_timeout())
        reported = status.value
        if reported is None:
            return supervisor_trouble(status, on_target=True, what="training status")
        trainers = reported.trainings()
    busy = []
    for slot in slots:
        report = trainers.get(slot.gpu_index)
        # A slot the supervisor does not know runs nothing it could stop; verify_gpu still has
        # to prove the memory is free.
        if report is not None and report.state != TrainerReportState.IDLE:
            busy.append((slot, report))
    if not busy:
        for slot in slots:
            ctx.slot_move(
                slot,
                TrainingState.IDLE,
                {TrainingState.STOPPING, TrainingState.TRAINING},
                "training stopped",
                pids=[],
            )
        return done(trainingSlots=len(slots))
    if not claimed and any(report.state != TrainerReportState.STOPPING for _, report in busy):
        # Idempotent on the supervisor: a second stop can tighten the deadline, never loosen it.
        stop = client.training_stop(grace_ms=grace_ms, timeout=ctx.call_timeout())
        if not stop.ok:
            return supervisor_trouble(stop, on_target=True, what="training stop")
    waiting = ", ".join(f"GPU {s.gpu_index} {r.state} (pids {list(r.pids)})" for s, r in busy)
    return pending(f"training still running: {waiting}", RETRY_FAST_MS)


def verify_gpu(ctx: StepContext) -> StepResult:
    """Prove every training GPU's memory is back under the policy's used/total ratio."""
    slots = training_slots(ctx.target)
    if not slots:
        return done(gpus=[])
    client = _target_client(ctx)
    if client is None:
        return _no_supervisor(ctx)
    memory_call = client.gpu_memory(timeout=ctx.call_timeout())
    memory = memory_call.value
    if memory is None:
        return supervisor_trouble(memory_call, on_target=True, what="GPU memory")
    limit = ctx.policy.verify_gpu_max_used_ratio
    over, seen = [], []
    for index in sorted({s.gpu_index for s in slots}):
        gpu = memory.gpu(index)
        if gpu is None:
            over.append(f"GPU {index} is not reported by the supervisor")
            continue
        seen.append({"index": index, "usedMiB": gpu.used_mib, "totalMiB": gpu.total_mib})
        if gpu.used_ratio > limit:
            over.append(
                f"GPU {index} holds {gpu.used_mib:.0f}/{gpu.total_mib:.0f} MiB "
                f"({percent(gpu.used_ratio)} > {percent(limit)})"
            )
    if over:
        return pending("memory not released: " + "; ".join(over), RETRY_FAST_MS)
    return done(gpus=seen)


def _not_proven_awake(report: StatusReport, models: list[str]) -> list[str]:
    """Return the bound models not proven awake (unknown and missing count as asleep)."""
    return [n for n in models if (m := report.model(n)) is None or m.sleeping is not False]


def _settle_probing(ctx: StepContext, report: StatusReport) -> None:
    slots, _ = bound_inference(ctx.target)  # fresh: this step just moved them to waking
    for slot in slots:
        names = list(slot.bindings.values_list("name", flat=True))
        if slot.state == InferenceState.WAKING and not _not_proven_awake(report, names):
            ctx.slot_move(slot, InferenceState.PROBING, {InferenceState.WAKING}, "awake")


def _bound_target(ctx: StepContext) -> tuple[list[Slot], list[str], SupervisorClient] | StepResult:
    """The target's bound inference slots and models, with a client for its supervisor; or the
    failure of a step that needs them."""
    slots, models = bound_inference(ctx.target)
    if not models:
        return failed(NO_INFERENCE_BINDINGS, f"domain {ctx.target.slug} has no model bindings")
    client = _target_client(ctx)
    if client is None:
        return _no_supervisor(ctx)
    return slots, models, client


def wake(ctx: StepContext) -> StepResult:
    """Wake every bound model of the target; done when the supervisor reports each awake."""
    bound = _bound_target(ctx)
    if isinstance(bound, StepResult):
        return bound
    slots, models, client = bound
    for slot in slots:
        if slot.state in (InferenceState.SLEEPING, InferenceState.FAILED):
            ctx.slot_move(slot, InferenceState.WAKING, {slot.state}, "promotion: waking")
    # Nudge, then check: the supervisor's wake is idempotent (awake models are left alone) and
    # blocks until its engines report awake, so the fast path is this call plus one status.
    woke = client.wake(timeout=ctx.call_timeout())
    if woke.unauthorized:
        return supervisor_trouble(woke, on_target=True, what="wake")
    if woke.error is not None and woke.error.code == INSUFFICIENT_GPU_MEMORY:
        # Memory someone else holds (a leaked trainer) does not free itself by waiting:
        # fail now, before any engine tries to allocate and dies of OOM.
        return failed(INSUFFICIENT_GPU_MEMORY, woke.error.message)
    status = client.status(timeout=ctx.call_timeout())
    report = status.value
    if report is None:
        return supervisor_trouble(status, on_target=True, what="status")
    asleep = _not_proven_awake(report, models)
    if not asleep:
        _settle_probing(ctx, report)
        return done(models=models)
    if not woke.ok:
        return supervisor_trouble(woke, on_target=True, what="wake")
    return pending(f"not awake yet: {', '.join(asleep)}")


def probe(ctx: StepContext) -> StepResult:
    """Golden-probe every bound model and LoRA adapter; any failure is final, routing never
    moves. A woken model must reproduce its baseline answer (fleets.core.golden)."""
    bound = _bound_target(ctx)
    if isinstance(bound, StepResult):
        return bound
    slots, models, client = bound
    timeout = ctx.call_timeout()
    targets = golden.targets_of(ctx.target)
    # The supervisor must answer before our own call gives up on it.
    result = golden.ask(
        client, targets, ctx.policy, timeout=timeout, timeout_ms=max(50, int(timeout * 900))
    )
    probed = result.value
    if probed is None:
        if result.error is not None and result.error.code == "invalid_target":
            # The supervisor does not serve a bound model: no retry will change that.
            return failed(PROBE_FAILED, f"probe: {result.error.message}")
        return supervisor_trouble(result, on_target=True, what="probe")
    judged = golden.judge_all(ctx.operation.fleet_id, targets, probed, ctx.policy)
    problems = [j.message for _, j in judged if j.verdict == Verdict.FAILED]
    if problems:
        return failed(PROBE_FAILED, "probe failed: " + "; ".join(problems))
    mismatched = [j.message for _, j in judged if j.verdict == Verdict.MISMATCH]
    if mismatched:
        return failed(
            PROBE_MISMATCH, "answer differs from its golden baseline: " + "; ".join(mismatched)
        )
    # Every adapter version a route names must answer here too, or routing never moves: the
    # pointer keeps the adapter routes, so the new active serves them the moment it moves.
    missing = golden.routed_adapters_check(
        fleet_id=ctx.operation.fleet_id,
        domain=ctx.target,
        client=client,
        timeout=timeout,
        actor=ctx.actor,
    )
    if missing:
        return failed(PROBE_FAILED, "adapter probe failed: " + "; ".join(missing[:5]))
    # The first serving of this profile and engine: what it answers now is the baseline.
    baseline_record(
        fleet_id=ctx.operation.fleet_id,
        domain_id=ctx.target.id,
        baselines=golden.unrecorded(judged),
        reason=BaselineReason.FIRST_SERVING,
        actor=ctx.actor,
        operation_id=ctx.operation.id,
        replace=False,
    )
    for slot in slots:
        paths: dict[str, tuple[InferenceState, ...]] = {
            InferenceState.WAKING: (InferenceState.PROBING, InferenceState.SERVING),
            InferenceState.PROBING: (InferenceState.SERVING,),
        }
        path = paths.get(slot.state, ())
        current = slot.state
        for to_state in path:
            ctx.slot_move(slot, to_state, {current}, "probe passed")
            current = to_state
    # The probe just proved each model's own server serves: say so before routing moves, or
    # the first snapshot after the switch would read the health the standby had asleep (down)
    # and refuse the new active's models until the next heartbeat.
    observed = clock.now()
    for binding_id in ModelBinding.objects.filter(
        domain_id=ctx.target.id, name__in=models
    ).values_list("id", flat=True):
        model_health_record(
            binding_id=binding_id,
            health=ServerHealth.UP,
            observed_at=observed,
            source="probe",
            actor=ctx.actor,
        )
    latencies = {
        r.model: r.latency_ms for r in probed.results if r.model in models and not r.adapter
    }
    return done(latencyMs=latencies, golden=golden.summary(judged))


def switch_route(ctx: StepContext) -> StepResult:
    """Move the routing pointer to the target: one CAS with the pointer read at step start."""
    op = ctx.operation
    fleet = (
        Fleet.objects.filter(pk=op.fleet_id)
        .values("active_domain_id", "route_revision", "slug")
        .get()
    )
    # The proxies' count of continued streams as routing moves: the operation's figure is
    # what it grows by from here (fleets/reads/continued_streams.py). Read before the CAS, as
    # no stream this switch frees can have been continued yet.
    mark: dict[str, Any] = {"streamsContinuedAtSwitch": streams_continued_mark(fleet["slug"])}
    if fleet["active_domain_id"] == op.target_domain_id:
        # Ours already committed (a crash between the CAS and recording the step), or the
        # pointer points where we want it anyway.
        return done(revision=fleet["route_revision"], alreadyActive=True, **mark)
    revision = route_switch(
        fleet_id=op.fleet_id,
        operation_id=op.id,
        target_domain_id=ctx.target.id,
        expected_active_id=fleet["active_domain_id"],
        expected_revision=fleet["route_revision"],
        actor=ctx.actor,
    )
    if revision is not None:
        source = fleet["active_domain_id"]
        return done(revision=revision, fromDomainId=str(source) if source else None, **mark)
    # Lost: re-read, and accept a pointer that already points at the target.
    again = Fleet.objects.filter(pk=op.fleet_id).values("active_domain_id", "route_revision").get()
    if again["active_domain_id"] == op.target_domain_id:
        return done(revision=again["route_revision"], alreadyActive=True, **mark)
    state = Operation.objects.filter(pk=op.id).values_list("state", flat=True).first()
    if state != OperationState.RUNNING:
        return pending("the operation is no longer running")
    return failed(
        CAS_LOST,
        f"the routing pointer changed while switching (now {again['active_domain_id']}, "
        f"revision {again['route_revision']})",
    )


def _source_is_active(ctx: StepContext) -> bool:
    active = Fleet.objects.filter(pk=ctx.operation.fleet_id).values_list(
        "active_domain_id", flat=True
    )
    return ctx.source is not None and active.first() == ctx.source.id


def _old_active(ctx: StepContext) -> posture.Target | StepResult:
    """Return the old active and a client for it, or a skip when there is nothing to do.

    Both best-effort steps skip rather than fail: the old active is often the domain that just
    died, and it must never be put to sleep if it serves traffic again.
    """
    source = ctx.source
    if source is None:
        return done("skipped", reason="there was no active domain to demote")
    if _source_is_active(ctx):
        return done("skipped", reason="the old active is the active domain again")
    if not source.supervisor_url:
        return done("skipped", reason=f"domain {source.slug} has no supervisor URL")
    return posture.Target(ctx.client_for(source), source, ctx.slot_move)


def _settle_left_ms(ctx: StepContext) -> int:
    """Milliseconds until no proxy can still send the old active a request (0: none left)."""
    # This leg's switch: a round-trip drill's second leg waits after its own (`back_switch_route`).
    switch_step = on_leg_of(Step.SWITCH_ROUTE, ctx.step)
    switched = (
        Event.objects.filter(
            operation_id=ctx.operation.id, kind="operation.step.done", step=switch_step
        )
        .values_list("created_at", flat=True)
        .first()
    )
    if switched is None:
        return 0
    elapsed_ms = (clock.now() - switched).total_seconds() * 1000
    return max(0, int(switch_settle_ms() - elapsed_ms))


def _engines(domain_id: Any) -> list[str | None]:
    """The engine of every model bound on a domain (what the proxy reads to continue)."""
    profiles = ModelBinding.objects.filter(domain_id=domain_id).values_list("profile", flat=True)
    return [engine_of(p) for p in profiles]


def _stream_migration(ctx: StepContext, old: posture.Target) -> DrainBound:
    """Whether the old active's sleep may abort long streams after the policy's bound: only
    with routing committed to this leg's probed target and every stream continuable there."""
    active = Fleet.objects.filter(pk=ctx.operation.fleet_id).values_list(
        "active_domain_id", flat=True
    )
    return drain_bound(
        after_ms=ctx.policy.stream_migration_after_ms,
        routed_to_target=active.first() == ctx.target.id,
        source_engines=_engines(old.domain.id),
        target_engines=_engines(ctx.target.id),
        source_takes_bound=old.client.takes_drain_bound(),
    )


def demote_old_sleep(ctx: StepContext) -> StepResult:
    """Best effort: put the old active's models to sleep, proven by the supervisor.

    Not before every proxy has stopped routing to it (`switch_settle_ms` after the switch),
    and then through the supervisor's drain: requests already running there finish, so a
    planned promotion cuts none. Where streams can continue on the new active
    (fleets.core.stream_migration), the drain is bounded by `streamMigrationAfterMs`: what
    still runs then is aborted there and continued by the proxy on the new active, so the
    promotion no longer lasts as long as the longest answer in flight.
    """
    old = _old_active(ctx)
    if isinstance(old, StepResult):
        return old
    left = _settle_left_ms(ctx)
    if left > 0:
        return pending(f"letting proxies move off {old.domain.slug} ({left} ms left)", left)
    decided: list[DrainBound] = []

    def bound_ms() -> int | None:
        # Decided after the status read that learned the supervisor's features.
        decided.append(_stream_migration(ctx, old))
        return decided[-1].ms

    slept = posture.ensure_asleep(
        old, ctx.call_timeout, budget=ctx.remaining_s, drain_bound=bound_ms
    )
    # What the sleep was given (or, when an earlier call sent it, what it is given now: the
    # same rule over the same facts), for the step's record.
    decision = decided[-1] if decided else _stream_migration(ctx, old)
    return _best_effort(
        slept, sleepProven=True, drainBoundMs=decision.ms, drainBound=decision.reason
    )


def _best_effort(result: posture.Posture, **proof: Any) -> StepResult:
    """The answer of a step on the old active: done once its posture is reached, else pending."""
    if result.reached:
        return done(**proof, **result.data)
    # Never fail the operation for the old active: keep trying until the step's budget ends.
    return pending(result.message)


def demote_old_train(ctx: StepContext) -> StepResult:
    """Best effort: start training on the old active, only if its sleep was proven."""
    if ctx.source is None:
        return done("skipped", reason="there was no active domain to demote")
    # The sleep step just before this one (a round-trip drill's second leg names it back_...).
    steps = steps_for(ctx.operation.kind, ctx.operation.drill_mode)
    sleep_step = steps[steps.index(ctx.step) - 1] if ctx.step in steps else Step.DEMOTE_OLD_SLEEP
    proven = Event.objects.filter(
        operation_id=ctx.operation.id, kind="operation.step.done", step=sleep_step
    ).exists()
    if not proven:
        # A model server still holding its weights would share the GPU with the trainer: OOM.
        return done("skipped", reason="sleep of the old active was not proven")
    old = _old_active(ctx)
    if isinstance(old, StepResult):
        return old
    return _best_effort(posture.ensure_training(old, ctx.call_timeout))


EXECUTORS: dict[str, Executor] = {
    Step.STOP_TRAINING: stop_training,
    Step.VERIFY_GPU: verify_gpu,
    Step.WAKE: wake,
    Step.PROBE: probe,
    Step.SWITCH_ROUTE: switch_route,
    Step.DEMOTE_OLD_SLEEP: demote_old_sleep,
    Step.DEMOTE_OLD_TRAIN: demote_old_train,
}
