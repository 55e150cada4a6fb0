"""Drive the fleet's rollout in flight one look further per tick (fleets/core/rollout.py).

Each state's handler is a re-entrant check-and-nudge like an operation's step: it reads where
the world is (the supervisor's status, the rollout's `progress`, the database), nudges it one
move further, and records what it learned through `fleets.services.rollouts` (a CAS on the
rollout's version). Supervisor calls are made here, outside any transaction.

- preparing: stop the standby's trainer, move its model's slot out of the sleeping posture,
  ask the supervisor to swap the model to the candidate profile, poll the status until the swap
  reads switched (or failed), then point the candidate binding at the new server's URL.
- checking: the answer checks; a candidate that fails never gets a user request (the split is
  set only after they pass).
- stepping: at each step the weight moves with `route_split_set`; the gates (through the
  injectable arm reader) and the answer checks are read on every look; a failure removes the
  split in one compare-and-swap first, then rolls back.
- promoting: a planned promotion of the standby (the operation machinery: no request lost).
- finishing: the old active, now the standby, is swapped to the new version and put back in
  standby posture (asleep, training).
- rolling_back: the split removed (if still there), the candidate swapped back to the old
  profile, then put back in standby posture.

A failover beside the rollout (a promotion or drill it did not ask for) pauses it first; the
rollout then waits for the operator.

An adapter version's rollout (candidate kind "adapter") is driven by
fleets/reconciler/adapter_rollout.py instead: none of the above touches it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fleets.base import clock
from fleets.base.errors import InvalidTarget, OperationConflict
from fleets.core.adapter_rollout import is_adapter
from fleets.core.golden import GOLDEN_SEED
from fleets.core.model_health import ServerHealth
from fleets.core.report import StatusReport, TrainerReportState
from fleets.core.rollout import (
    AnswerCheck,
    CandidateKind,
    CheckOutcome,
    GateVerdict,
    RolloutState,
    candidate_parse,
    checks_judge,
    gate_decide,
    gates_parse,
    steps_parse,
    weight_permille,
)
from fleets.core.route_split import Split, splits_parse
from fleets.core.states import (
    DomainState,
    InferenceState,
    OperationKind,
    OperationState,
    TrainingState,
)
from fleets.core.urls import without_userinfo
from fleets.models import Domain, Fleet, Id, ModelBinding, Operation, Slot
from fleets.reads.arm_stats import arm_windows
from fleets.reads.selectors import fleet_view
from fleets.reconciler.adapter_rollout import adapter_rollout_advance
from fleets.reconciler.rollout_look import ArmReader, LookContext
from fleets.reconciler.steps import posture
from fleets.reconciler.steps.base import SlotMover, training_slots
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.reconciler.supervisor.transport import Call
from fleets.services.model_health import model_health_record
from fleets.services.operations import operation_request
from fleets.services.rollouts import binding_serving_move, rollout_in_flight
from fleets.services.route_pointer import pointer_movers
from fleets.services.route_splits import route_split_set

log = logging.getLogger(__name__)

# One supervisor call of a rollout waits at most this long.
CALL_TIMEOUT_S = 5.0
# How long a swap may take from its request to `switched` before the rollout gives up on it
# (the supervisor's own start timeout is 10 minutes by default; this leaves it room).
SWAP_DEADLINE_S = 15 * 60
# How long the answer checks may fail to get an answer (a supervisor away) before the rollout
# rolls back: a candidate that cannot be checked is not served.
CHECK_DEADLINE_S = 5 * 60
# How long the restore of a rollback may keep failing before the rollout ends anyway, saying
# what was not restored (a standby that died: the reconciler restores its posture on return).
RESTORE_DEADLINE_S = 15 * 60
# How soon a rollout waiting on the outside world is looked at again.
NUDGE_MS = 500
# How many times a lost route CAS (the revision moved under it) is retried in one look.
SPLIT_ATTEMPTS = 3


@dataclass(frozen=True)
class RolloutLook:
    rollout_id: str
    state: str
    nudge_ms: int | None = None


_Ctx = LookContext


def rollout_advance(
    *,
    fleet_id: Id,
    client_for: Callable[[Domain], SupervisorClient],
    actor: str = "reconciler",
    arm_reader: ArmReader | None = None,
) -> RolloutLook | None:
    """Look at the fleet's rollout in flight once; None when there is none."""
    rollout = rollout_in_flight(fleet_id)
    if rollout is None:
        return None
    policy = fleet_view(Fleet.objects.get(pk=fleet_id)).policy
    if is_adapter(rollout.candidate):
        # An adapter version's rollout (fleets/reconciler/adapter_rollout.py): no swap, no
        # standby, no pointer; it runs beside a failover.
        nudge = adapter_rollout_advance(
            rollout=rollout,
            client_for=client_for,
            arm_reader=arm_reader or arm_windows,
            actor=actor,
            policy=policy,
        )
        return RolloutLook(str(rollout.id), rollout.state, nudge)
    ctx = _Ctx(
        rollout=rollout,
        client_for=client_for,
        reader=arm_reader or arm_windows,
        actor=actor,
        now=clock.now(),
        policy=policy,
    )
    if _failover_beside(ctx):
        return RolloutLook(str(rollout.id), rollout.state)
    handler = _HANDLERS.get(RolloutState(rollout.state))
    nudge = handler(ctx) if handler is not None else None
    return RolloutLook(str(rollout.id), ctx.rollout.state, nudge)


def _domain(pk: Id | None) -> Domain | None:
    return None if pk is None else Domain.objects.filter(pk=pk).first()


def _domain_get(pk: Id | None) -> Domain:
    domain = _domain(pk)
    if domain is None:
        raise LookupError("the rollout's candidate domain is gone")
    return domain


# --- failures beside the rollout ----------------------------------------------------------


def _failover_beside(ctx: _Ctx) -> bool:
    """A promotion or drill the rollout did not ask for is in flight: "failover comes first".
    The rollout pauses (the promotion's pointer move clears the split) and waits for the
    operator. Returns whether it paused."""
    rollout = ctx.rollout
    if rollout.state not in (
        RolloutState.PREPARING,
        RolloutState.CHECKING,
        RolloutState.STEPPING,
        RolloutState.PROMOTING,
    ):
        return False
    # Its own planned promotion is not a failover (asked with reason "rollout").
    movers = pointer_movers(rollout.fleet_id).exclude(reason="rollout")
    mover = movers.first()
    if mover is None:
        return False
    ctx.move(
        to_state=RolloutState.PAUSED,
        event="paused",
        why=f"a {mover.kind} of {mover.target_domain_slug} ({mover.reason}) is in flight: "
        "failover comes first; the rollout waits for the operator",
        values={"paused_from": rollout.state, "pinned": False},
        progress={"pausedBy": "failover", "pausedFor": str(mover.id)},
    )
    return True


def _standby_failed(ctx: _Ctx) -> str | None:
    """Why the candidate domain counts as failed now, or None."""
    domain = _domain(ctx.rollout.candidate_domain_id)
    if domain is None:
        return "the candidate domain is gone"
    if domain.state == DomainState.FAILED:
        return f"the standby {domain.slug} failed"
    failing = domain.heartbeat_failing_since
    stale = timedelta(milliseconds=ctx.policy.heartbeat_stale_ms)
    if failing is not None and ctx.now - failing >= stale:
        # As long unanswered as an active would be failed over for.
        return f"the standby {domain.slug} has not answered for {(ctx.now - failing).seconds} s"
    slot_ids = ModelBinding.objects.filter(domain=domain, name=ctx.rollout.model).values("slot_id")
    if Slot.objects.filter(pk__in=slot_ids, state=InferenceState.FAILED).exists():
        return f"{ctx.rollout.model}'s server on the standby {domain.slug} failed"
    return None


# --- the weight ----------------------------------------------------------------------------


def _split_set(ctx: _Ctx, permille: int | None, reason: str) -> bool:
    """Set (None: remove) the model's split; retry a lost CAS a few times. Whether it holds."""
    rollout = ctx.rollout
    for _ in range(SPLIT_ATTEMPTS):
        fleet = Fleet.objects.filter(pk=rollout.fleet_id).values("route_revision", "route_splits")
        row = fleet.first()
        if row is None:
            return False
        current = splits_parse(row["route_splits"]).get(rollout.model)
        if permille is None and (current is None or current.rollout_id != str(rollout.id)):
            return True  # nothing of ours to remove (a pointer move cleared it)
        split = (
            None
            if permille is None
            else Split(
                rollout_id=str(rollout.id),
                candidate_domain_id=str(rollout.candidate_domain_id),
                weight_permille=permille,
                sticky_header=rollout.sticky_header,
            )
        )
        moved = route_split_set(
            fleet_id=rollout.fleet_id,
            model=rollout.model,
            split=split,
            expected_revision=row["route_revision"],
            actor=ctx.actor,
            reason=reason,
        )
        if moved is not None:
            return True
    return False


def _roll_back(ctx: _Ctx, why: str, *, breach_at: datetime | None = None) -> int | None:
    """The weight to 0 in one compare-and-swap first, then the rollout to rolling_back with
    why and the time from the breach to the weight change."""
    removed = _split_set(ctx, None, f"rollout {ctx.rollout.id} rolled back: {why}")
    changed_at = clock.now()
    progress: dict[str, Any] = {"rollbackRequestedAt": changed_at.isoformat()}
    if removed:
        progress["weightZeroAt"] = changed_at.isoformat()
    if breach_at is not None:
        progress["breachAt"] = breach_at.isoformat()
        if removed:
            ms = int((changed_at - breach_at).total_seconds() * 1000)
            progress["breachToWeightChangeMs"] = max(0, ms)
    ctx.move(
        to_state=RolloutState.ROLLING_BACK,
        event="rolling_back",
        why=why,
        values={"weight_permille": 0 if removed else ctx.rollout.weight_permille},
        progress=progress,
        data={k: v for k, v in progress.items() if k == "breachToWeightChangeMs"},
    )
    return NUDGE_MS if removed else NUDGE_MS * 2


# --- supervisor helpers --------------------------------------------------------------------


def _model_entry(report: StatusReport, model: str) -> Mapping[str, Any] | None:
    """The model's entry of the status as sent (its `port` and `swap` are read from it)."""
    for slot in report.raw.get("slots", ()) if isinstance(report.raw, dict) else ():
        for entry in slot.get("models", ()) if isinstance(slot, dict) else ():
            if isinstance(entry, dict) and entry.get("name") == model:
                return entry
    return None


def _with_port(url: str, port: int) -> str:
    """`url` on another port (credentials never ride in a serving URL: any are dropped)."""
    parts = urlsplit(without_userinfo(url))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


def _why(call: Call[Any]) -> str:
    return call.error.message if call.error is not None else "no answer"


@dataclass(frozen=True)
class _Swap:
    done: bool = False
    failed: str = ""  # why it failed (the supervisor's words)
    waiting: str = ""


def _swap(
    ctx: _Ctx,
    domain: Domain,
    client: SupervisorClient,
    report: StatusReport,
    profile: Mapping[str, Any],
    key: str,
) -> _Swap:
    """Ask for the swap once (recorded at `progress[key]`), then read its progress."""
    rollout = ctx.rollout
    asked = ctx.progress(key)
    if not asked:
        answer = client.model_swap(
            model=rollout.model, profile=profile, mode=rollout.swap_mode, timeout=CALL_TIMEOUT_S
        )
        if answer.value is None:
            error = answer.error
            final = error is not None and (
                error.status in (400, 404) or (error.status == 409 and error.code == "no_free_port")
            )
            if error is not None and final:
                return _Swap(failed=f"swap refused by {domain.slug}: {error.message}")
            return _Swap(waiting=f"swap on {domain.slug}: {_why(answer)}")
        port = answer.value.get("port")
        before = (_model_entry(report, rollout.model) or {}).get("swap")
        # An earlier swap of the same model on the same port (in place) must not read as ours.
        seen = before.get("startedAt") if isinstance(before, dict) else None
        ctx.move(
            event="swap_requested",
            progress={
                key: {
                    "at": ctx.now.isoformat(),
                    "port": port,
                    "domain": domain.slug,
                    "before": seen,
                }
            },
            data={"domainId": str(domain.id), "port": port, "mode": rollout.swap_mode},
        )
        return _Swap(waiting="swap requested")
    entry = _model_entry(report, rollout.model) or {}
    swap = entry.get("swap") if isinstance(entry.get("swap"), dict) else None
    started = datetime.fromisoformat(asked["at"])
    ours = (
        swap is not None
        and swap.get("port") == asked.get("port")
        and (asked.get("before") is None or swap.get("startedAt") != asked.get("before"))
    )
    if swap is not None and ours:
        if swap.get("state") == "switched":
            return _Swap(done=True)
        if swap.get("state") == "failed":
            return _Swap(failed=f"swap on {domain.slug} failed: {swap.get('error', 'no reason')}")
    if (ctx.now - started).total_seconds() > SWAP_DEADLINE_S:
        return _Swap(failed=f"swap on {domain.slug} not switched after {SWAP_DEADLINE_S} s")
    state = swap.get("state") if swap else "not reported yet"
    return _Swap(waiting=f"swap on {domain.slug}: {state}")


def _learn_url(ctx: _Ctx, domain: Domain, report: StatusReport, profile: Mapping[str, Any]) -> bool:
    """Point the model's binding on `domain` at the port the status reports (and `profile`)."""
    binding = ModelBinding.objects.filter(domain=domain, name=ctx.rollout.model).first()
    entry = _model_entry(report, ctx.rollout.model)
    if binding is None or entry is None or not isinstance(entry.get("port"), int):
        return False
    url = _with_port(binding.serving_url, entry["port"])
    if url == binding.serving_url and binding.profile == dict(profile):
        return True
    return binding_serving_move(
        rollout=ctx.rollout,
        domain_id=domain.id,
        expected_url=binding.serving_url,
        serving_url=url,
        profile=profile,
        actor=ctx.actor,
    )


def _stop_training(
    ctx: _Ctx, domain: Domain, client: SupervisorClient, report: StatusReport
) -> bool:
    """Stop the domain's trainers (as a promotion does); True once every one is idle."""
    slots = training_slots(domain)
    busy = [
        s
        for s in slots
        if (r := report.training(s.gpu_index)) is not None and r.state != TrainerReportState.IDLE
    ]
    mover = SlotMover(None, ctx.actor)
    if not busy:
        for slot in slots:
            mover(
                slot,
                TrainingState.IDLE,
                {TrainingState.STOPPING, TrainingState.TRAINING},
                "rollout: training stopped",
                pids=[],
            )
        return True
    for slot in busy:
        mover(slot, TrainingState.STOPPING, {TrainingState.TRAINING}, "rollout: stopping training")
    client.training_stop(
        grace_ms=ctx.policy.training_stop_grace(outage=False), timeout=CALL_TIMEOUT_S
    )
    return False


def _slot_serving(ctx: _Ctx, domain: Domain) -> None:
    """Move the model's slot on `domain` to serving: the heartbeat leaves a serving standby slot
    alone while a rollout is in flight, and a swap's new server starts awake."""
    mover = SlotMover(None, ctx.actor)
    slot_ids = ModelBinding.objects.filter(domain=domain, name=ctx.rollout.model).values("slot_id")
    paths = {
        InferenceState.SLEEPING: (InferenceState.WAKING, InferenceState.PROBING),
        InferenceState.FAILED: (InferenceState.WAKING, InferenceState.PROBING),
        InferenceState.WAKING: (InferenceState.PROBING,),
        InferenceState.PROBING: (),
    }
    for slot in Slot.objects.filter(pk__in=slot_ids):
        if slot.state not in paths:
            continue
        current = slot.state
        for to_state in (*paths[InferenceState(current)], InferenceState.SERVING):
            mover(slot, to_state, {current}, "rollout: serving the swapped model")
            current = to_state


def _prepare_domain(
    ctx: _Ctx, domain: Domain, profile: Mapping[str, Any], key: str
) -> tuple[bool, str]:
    """Stop training, swap the model to `profile`, learn its URL. (done, what is awaited or
    why it failed: failed when done is False and the message starts with "!")."""
    client = ctx.client_for(domain)
    status = client.status(timeout=CALL_TIMEOUT_S)
    report = status.value
    if report is None:
        return False, f"status of {domain.slug}: {_why(status)}"
    if not client.takes_swap():
        return False, (
            f"!domain {domain.slug}'s supervisor does not list the feature model.swap: "
            "upgrade it before rolling out"
        )
    if not _stop_training(ctx, domain, client, report):
        return False, f"training still stopping on {domain.slug}"
    if not ctx.progress(key):
        _slot_serving(ctx, domain)
    swap = _swap(ctx, domain, client, report, profile, key)
    if swap.failed:
        return False, "!" + swap.failed
    if not swap.done:
        return False, swap.waiting
    if not _learn_url(ctx, domain, report, profile):
        return False, f"the new server's URL on {domain.slug} is not known yet"
    return True, ""


# --- the answer checks ---------------------------------------------------------------------


def _ask(client: SupervisorClient, model: str, check: AnswerCheck) -> tuple[str | None, bool]:
    """The model's answer to one check at temperature 0 (None: none), and whether the call
    failed (a supervisor away: ask again later, not a failed check)."""
    result = client.probe(
        prompt=check.prompt,
        max_tokens=check.max_tokens,
        timeout_ms=int(CALL_TIMEOUT_S * 900),
        models=[model],
        timeout=CALL_TIMEOUT_S,
        seed=GOLDEN_SEED,
    )
    report = result.value
    if report is None:
        return None, True
    answer = report.result(model)
    if answer is None or not answer.ok:
        return None, False
    if not report.golden:
        # Not asked greedy and seeded: the answer cannot be compared or trusted as one.
        return None, False
    return answer.answer, False


def _run_checks(ctx: _Ctx) -> CheckOutcome | None:
    """Run the answer checks on the candidate; None when a supervisor did not answer."""
    rollout = ctx.rollout
    candidate = candidate_parse(rollout.candidate)
    checks = list(candidate.checks)
    if candidate.kind == CandidateKind.SAME_WEIGHTS:
        # The fleet's golden prompt always, beside the operator's.
        checks.insert(
            0, AnswerCheck(ctx.policy.probe_prompt, max_tokens=ctx.policy.probe_max_tokens)
        )
    cand_domain = _domain_get(rollout.candidate_domain_id)
    cand_client = ctx.client_for(cand_domain)
    stable_client = None
    if candidate.kind == CandidateKind.SAME_WEIGHTS:
        # The stable arm: whatever the pointer names now (never the candidate's own answer).
        active_id = Fleet.objects.filter(pk=rollout.fleet_id).values_list(
            "active_domain_id", flat=True
        )
        stable = _domain(active_id.first())
        if stable is None or stable.id == cand_domain.id:
            return CheckOutcome(False, ("no stable arm to compare the answers with",))
        stable_client = ctx.client_for(stable)
    got: list[str | None] = []
    want: list[str | None] = []
    for check in checks:
        answer, away = _ask(cand_client, rollout.model, check)
        if away:
            return None
        got.append(answer)
        if stable_client is not None:
            answer, away = _ask(stable_client, rollout.model, check)
            if away:
                return None
            want.append(answer)
    return checks_judge(candidate.kind, checks, got, want if stable_client else None)


# --- the states ----------------------------------------------------------------------------


def _pending(ctx: _Ctx) -> int | None:
    ctx.move(
        to_state=RolloutState.PREPARING,
        event="preparing",
        values={"started_at": ctx.now},
        progress={"preparingAt": ctx.now.isoformat()},
    )
    return 0


def _preparing(ctx: _Ctx) -> int | None:
    failed = _standby_failed(ctx)
    if failed:
        return _roll_back(ctx, failed)
    domain = _domain_get(ctx.rollout.candidate_domain_id)
    profile = candidate_parse(ctx.rollout.candidate).profile
    done, message = _prepare_domain(ctx, domain, profile, "swap")
    if message.startswith("!"):
        # The rollback restores what was changed (the trainer, a swap that switched).
        return _roll_back(ctx, message[1:])
    if not done:
        if message and message != ctx.rollout.why:
            ctx.move(event="waiting", why=message)
        return NUDGE_MS
    ctx.move(
        to_state=RolloutState.CHECKING,
        event="checking",
        why="the candidate serves the new version; checking its answers",
        progress={"checkingAt": ctx.now.isoformat()},
    )
    return 0


def _first_step(ctx: _Ctx) -> int | None:
    steps = steps_parse(ctx.rollout.steps)
    if steps[0].weight >= 100:
        return _to_promoting(ctx, "the only step is 100 %")
    return _step_to(ctx, 0)


def _step_to(ctx: _Ctx, index: int) -> int | None:
    steps = steps_parse(ctx.rollout.steps)
    step = steps[index]
    permille = weight_permille(step.weight)
    if not _split_set(ctx, permille, f"rollout {ctx.rollout.id} step {index}: {step.weight} %"):
        return NUDGE_MS
    ctx.move(
        to_state=RolloutState.STEPPING,
        event="stepped",
        why=f"step {index + 1} of {len(steps)}: {step.weight} % to the candidate",
        values={"step_index": index, "weight_permille": permille, "step_started_at": clock.now()},
        data={"step": index, "weight": step.weight, "dwellS": step.dwell_s},
    )
    return NUDGE_MS


def _to_promoting(ctx: _Ctx, why: str) -> int | None:
    ctx.move(
        to_state=RolloutState.PROMOTING,
        event="promoting",
        why=why,
        values={"step_started_at": clock.now()},
    )
    return 0


def _checking(ctx: _Ctx) -> int | None:
    failed = _standby_failed(ctx)
    if failed:
        return _roll_back(ctx, failed)
    outcome = _run_checks(ctx)
    if outcome is None:
        waited = ctx.since("checkingAt") or 0
        if waited > CHECK_DEADLINE_S:
            return _roll_back(ctx, f"the answer checks got no answer for {waited:.0f} s")
        return NUDGE_MS
    if not outcome.passed:
        # The split was never set: no user request reached the candidate.
        return _roll_back(ctx, "answer check failed: " + outcome.message())
    ctx.move(event="checked", progress={"checkedStep": -1}, data={"step": -1})
    # The checks just proved the candidate's server answers: say so before the split routes to
    # it, or the proxies would read the health it had asleep until the next heartbeat.
    candidate = ModelBinding.objects.filter(
        domain=_domain(ctx.rollout.candidate_domain_id), name=ctx.rollout.model
    )
    for binding_id in candidate.values_list("id", flat=True):
        model_health_record(
            binding_id=binding_id,
            health=ServerHealth.UP,
            observed_at=clock.now(),
            source="probe",
            actor=ctx.actor,
        )
    return _first_step(ctx)


def _stepping(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    failed = _standby_failed(ctx)
    if failed:
        return _roll_back(ctx, failed)
    steps = steps_parse(rollout.steps)
    gates = gates_parse(rollout.gates)
    index = max(0, rollout.step_index)
    started = rollout.step_started_at or ctx.now
    since = max(started, ctx.now - timedelta(seconds=gates.window_s))
    windows = ctx.reader(rollout_id=str(rollout.id), model=rollout.model, since=since, until=None)
    decision = gate_decide(windows, gates)
    if decision.verdict == GateVerdict.FAIL:
        return _roll_back(ctx, "gate failed: " + decision.reason, breach_at=ctx.now)
    if ctx.progress("checkedStep") != index:
        outcome = _run_checks(ctx)
        if outcome is not None and not outcome.passed:
            # The breach is the answer that failed, known once the checks are back (they take a
            # probe of each arm), not the start of this look.
            return _roll_back(
                ctx, "answer check failed: " + outcome.message(), breach_at=clock.now()
            )
        if outcome is not None:
            ctx.move(event="checked", progress={"checkedStep": index}, data={"step": index})
    dwelt = (ctx.now - started).total_seconds()
    if dwelt < steps[index].dwell_s or decision.verdict != GateVerdict.PASS:
        # Recorded when the verdict changes, not on every look (the counts move every tick).
        if ctx.progress("gateVerdict") != [index, decision.verdict.value]:
            ctx.move(
                event="gate",
                why=decision.reason if decision.verdict == GateVerdict.WAIT else None,
                progress={"gateVerdict": [index, decision.verdict.value], "gate": decision.figures},
                data={"step": index, "verdict": decision.verdict.value},
            )
        return NUDGE_MS
    if ctx.progress("checkedStep") != index:
        return NUDGE_MS
    if index + 1 >= len(steps) or steps[index + 1].weight >= 100:
        return _to_promoting(ctx, f"every step passed its gates ({decision.reason})")
    # The next step's answer checks run before its weight is set, not after: a candidate gone
    # bad during this step is caught at this step's weight, never given the larger share.
    outcome = _run_checks(ctx)
    if outcome is None:
        return NUDGE_MS
    if not outcome.passed:
        return _roll_back(ctx, "answer check failed: " + outcome.message(), breach_at=clock.now())
    ctx.move(event="checked", progress={"checkedStep": index + 1}, data={"step": index + 1})
    return _step_to(ctx, index + 1)


def _promoting(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    op_id = ctx.progress("promotionId")
    if not op_id:
        failed = _standby_failed(ctx)
        if failed:
            return _roll_back(ctx, failed)
        fleet = Fleet.objects.get(pk=rollout.fleet_id)
        try:
            result = operation_request(
                fleet=fleet,
                kind=OperationKind.PROMOTE,
                target_domain_id=str(rollout.candidate_domain_id),
                actor=ctx.actor,
                reason="rollout",
            )
        except OperationConflict:
            return NUDGE_MS  # another operation first; the next look asks again
        except InvalidTarget as exc:
            return _roll_back(ctx, f"the candidate cannot be promoted: {exc.message}")
        if result.operation is None:  # already the active
            return _finish_start(ctx)
        ctx.move(
            event="promotion_requested",
            progress={"promotionId": str(result.operation.id)},
            data={"operationId": str(result.operation.id)},
        )
        return NUDGE_MS
    op = Operation.objects.filter(pk=op_id).first()
    if op is None or op.state in (OperationState.FAILED, OperationState.CANCELLED):
        if op is not None and op.routing_committed:
            return _finish_start(ctx)
        why = (op.error or {}).get("message", "") if op is not None else "it is gone"
        return _roll_back(ctx, f"the planned promotion did not finish: {why}")
    if op.state == OperationState.SUCCEEDED:
        return _finish_start(ctx)
    return NUDGE_MS


def _finish_start(ctx: _Ctx) -> int | None:
    ctx.move(
        to_state=RolloutState.FINISHING,
        event="finishing",
        why="the candidate is the active; moving the old active to the new version",
        values={"weight_permille": 1000, "step_started_at": clock.now()},
    )
    return 0


def _finishing(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    old = _domain(rollout.stable_domain_id)
    if old is None:
        ctx.move(to_state=RolloutState.SUCCEEDED, event="succeeded", why="the old active is gone")
        return None
    active = Fleet.objects.filter(pk=rollout.fleet_id).values_list("active_domain_id", flat=True)
    if active.first() == old.id:
        ctx.move(
            to_state=RolloutState.FAILED,
            event="failed",
            why=f"{old.slug} is the active again: it was not moved to the new version",
        )
        return None
    if Operation.objects.filter(
        fleet_id=rollout.fleet_id, state__in=[OperationState.PENDING, OperationState.RUNNING]
    ).exists():
        return NUDGE_MS  # the promotion's steps on the old active first
    profile = candidate_parse(rollout.candidate).profile
    if not ctx.progress("finishSwapped"):
        done, message = _prepare_domain(ctx, old, profile, "finishSwap")
        if message.startswith("!"):
            ctx.move(
                to_state=RolloutState.FAILED,
                event="failed",
                why=f"the new version serves on the active, but {message[1:]}; {old.slug} "
                "still runs the old version",
            )
            return None
        if not done:
            return NUDGE_MS
        ctx.move(event="old_active_swapped", progress={"finishSwapped": True})
    reached = _standby_posture(ctx, old)
    if not reached:
        return NUDGE_MS
    ctx.move(
        to_state=RolloutState.SUCCEEDED,
        event="succeeded",
        why="both domains serve the new version; the standby is asleep and training",
    )
    return None


def _standby_posture(ctx: _Ctx, domain: Domain) -> bool:
    """Asleep (proven), then training (proven): the standby's posture."""
    target = posture.Target(ctx.client_for(domain), domain, SlotMover(None, ctx.actor))
    slept = posture.ensure_asleep(target, lambda: CALL_TIMEOUT_S)
    if not slept.reached:
        return False
    return posture.ensure_training(target, lambda: CALL_TIMEOUT_S).reached


def _rolling_back(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    if not _split_set(ctx, None, f"rollout {rollout.id} rolled back"):
        return NUDGE_MS
    end = RolloutState.ABORTED if rollout.abort_requested else RolloutState.ROLLED_BACK
    domain = _domain(rollout.candidate_domain_id)
    waited = ctx.since("rollbackRequestedAt") or 0
    gone = _standby_failed(ctx)
    if domain is None or gone or waited > RESTORE_DEADLINE_S:
        left = gone or f"{domain.slug if domain else 'the candidate'} not restored in time"
        ctx.move(
            to_state=end,
            event=end.value,
            why=f"{rollout.why} ({left}: its posture is restored when it returns; its "
            "model may still run the candidate profile there until an operator swaps it back)",
        )
        return None
    previous = (rollout.previous or {}).get(str(domain.id), {})
    old_profile = previous.get("profile") or {}
    binding = ModelBinding.objects.filter(domain=domain, name=rollout.model).first()
    swapped = ctx.progress("swap") and binding is not None and binding.profile != old_profile
    if (swapped or ctx.progress("restoreSwap")) and not ctx.progress("restored"):
        done, message = _prepare_domain(ctx, domain, old_profile, "restoreSwap")
        if message.startswith("!"):
            ctx.move(
                to_state=RolloutState.FAILED,
                event="failed",
                why=f"{rollout.why}; the old version was not restored: {message[1:]}",
            )
            return None
        if not done:
            return NUDGE_MS
        ctx.move(event="restored", progress={"restored": True})
    active = Fleet.objects.filter(pk=rollout.fleet_id).values_list("active_domain_id", flat=True)
    if active.first() != domain.id and not _standby_posture(ctx, domain):
        return NUDGE_MS
    ctx.move(to_state=end, event=end.value, why=rollout.why)
    return None


def _paused(ctx: _Ctx) -> int | None:
    return None  # the operator's move


_HANDLERS: dict[RolloutState, Callable[[_Ctx], int | None]] = {
    RolloutState.PENDING: _pending,
    RolloutState.PREPARING: _preparing,
    RolloutState.CHECKING: _checking,
    RolloutState.STEPPING: _stepping,
    RolloutState.PROMOTING: _promoting,
    RolloutState.FINISHING: _finishing,
    RolloutState.ROLLING_BACK: _rolling_back,
    RolloutState.PAUSED: _paused,
}
