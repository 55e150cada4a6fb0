"""Drive an adapter rollout one look further per tick, and start one when a new version is ready.

The rollout's states are fleets/core/adapter_rollout.py's reading of the rollout states. Each
handler reads where the world is (the registry's copy on the active, the fleet's adapter route,
the proxies' per-arm samples), nudges it one move further, and records what it learned through
`fleets.services.rollouts.rollout_move` (a CAS on the rollout's version). The route itself moves
only through `services.adapter_routes.adapter_route_set` (a CAS on the route revision), never
inside a transaction with a supervisor call.

- preparing: wait until the version's copy on the active is probed (the registry's reconciler
  transfers, loads and probes it against the trainer's recorded answers); a failed copy or the
  policy's `adapterRollout.prepareTimeoutMs` ends it, nothing routed.
- checking: the operator's own checks (if any) against `NAME@vN` on the active, through the
  supervisor's golden probe, as a model rollout asks its candidate.
- stepping: the route's candidate = N at the step's weight; the gates read the arms exactly as
  a model rollout's do (the proxies record them under this rollout's id, model = the adapter's
  name). A breach: ONE CAS to `route.rolled_back()` first (the candidate and its weight go, the
  version stays), then the rollout's record of breach -> weight change.
- promoting: after the last step's dwell, ONE CAS makes the route name N, with no candidate.
  The previous version stays loaded until then; the registry's retention unloads it after.

A breach is dated at the start of the look that read it (`ctx.now`, before the arms are read);
the weight change at the CAS's return: `breachToWeightChangeMs` measures the look's own work
(one indexed read of the arm samples, one UPDATE). How late a breach is seen is bounded apart:
by the proxies' flush of their per-second samples and the look interval (`NUDGE_MS` while a
rollout steps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from common.adapter_manifest import engine_name
from fleets.base import clock
from fleets.base.errors import ServiceError
from fleets.core.adapter_rollout import (
    ADAPTER_KIND,
    AdapterCandidate,
    adapter_candidate_parse,
    auto_candidates,
    owns,
    route_promoted,
    route_stepped,
)
from fleets.core.adapter_route import AdapterRoute, AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import AdapterVersionState, CopyState
from fleets.core.golden import GOLDEN_SEED
from fleets.core.policy import Policy
from fleets.core.rollout import (
    CandidateKind,
    CheckOutcome,
    GateDecision,
    GateVerdict,
    RolloutState,
    checks_judge,
    gate_decide,
    gates_parse,
    steps_parse,
    weight_permille,
)
from fleets.models import AdapterCopy, AdapterVersion, Domain, Fleet, Rollout
from fleets.reconciler.rollout_look import ArmReader, LookContext
from fleets.reconciler.supervisor.client import SupervisorClient
from fleets.services.adapter_routes import adapter_route_set
from fleets.services.rollouts import rollout_create, rollout_in_flight

log = logging.getLogger(__name__)

# One supervisor call of a rollout waits at most this long.
CALL_TIMEOUT_S = 5.0
# How long the operator's checks may go unanswered (a supervisor away) before the rollout rolls
# back: a candidate that cannot be checked is not served.
CHECK_DEADLINE_S = 5 * 60
# How soon a rollout waiting on the outside world is looked at again.
NUDGE_MS = 500
# How many times a lost route CAS (the revision moved under it) is retried in one look.
ROUTE_ATTEMPTS = 3
# At most this many (name, version) rows are read to find what an automatic rollout may start.
MAX_READY_ROWS = 1000


@dataclass
class _Ctx(LookContext):
    candidate: AdapterCandidate

    @property
    def engine_name(self) -> str:
        return engine_name(self.candidate.adapter, self.candidate.version)


def adapter_rollout_advance(
    *,
    rollout: Rollout,
    client_for: Callable[[Domain], SupervisorClient],
    arm_reader: ArmReader,
    actor: str,
    policy: Policy,
) -> int | None:
    """Look at an adapter rollout once; return how soon to look again (None: not by itself)."""
    ctx = _Ctx(
        rollout=rollout,
        candidate=adapter_candidate_parse(rollout.candidate),
        client_for=client_for,
        reader=arm_reader,
        actor=actor,
        now=clock.now(),
        policy=policy,
    )
    handler = _HANDLERS.get(RolloutState(rollout.state))
    return handler(ctx) if handler is not None else None


# --- the route -----------------------------------------------------------------------------


class _RouteGone(Exception):
    """The adapter's route is not there (removed under the rollout)."""


def _route_write(
    ctx: _Ctx, make: Callable[[AdapterRoute], AdapterRoute | None], reason: str
) -> bool:
    """Write `make(route as read)` with one CAS (None from `make`: nothing to write); retry a
    lost CAS a few times. Whether the route now holds what `make` wanted. Raises _RouteGone, or
    AdapterRouteInvalid for a version the registry no longer holds (nothing written)."""
    rollout = ctx.rollout
    for _ in range(ROUTE_ATTEMPTS):
        row = (
            Fleet.objects.filter(pk=rollout.fleet_id)
            .values("route_revision", "adapter_routes")
            .first()
        )
        if row is None:
            raise _RouteGone("the fleet is gone")
        route = adapter_routes_parse(row["adapter_routes"]).get(rollout.model)
        if route is None:
            raise _RouteGone(f"the route of {rollout.model!r} is gone")
        wanted = make(route)
        if wanted is None:
            return True
        moved = adapter_route_set(
            fleet_id=rollout.fleet_id,
            name=rollout.model,
            route=wanted,
            expected_revision=row["route_revision"],
            actor=ctx.actor,
            reason=reason,
        )
        if moved is not None:
            return True
    return False


def _rolled_back(rollout_id: str) -> Callable[[AdapterRoute], AdapterRoute | None]:
    return lambda route: route.rolled_back() if owns(route, rollout_id) else None


def _roll_back(ctx: _Ctx, why: str, *, breach_at: datetime | None = None) -> int | None:
    """The candidate off the route in ONE compare-and-swap first, then the rollout's record:
    rolling_back with why and the time from the breach to the weight change, then its end."""
    rollout = ctx.rollout
    try:
        removed = _route_write(ctx, _rolled_back(str(rollout.id)), f"rollout {rollout.id}: {why}")
    except (_RouteGone, AdapterRouteInvalid):
        removed = True  # nothing of ours is routed
    changed_at = clock.now()
    progress: dict[str, Any] = {"rollbackRequestedAt": changed_at.isoformat()}
    if removed:
        progress["weightZeroAt"] = changed_at.isoformat()
    if breach_at is not None:
        progress["breachAt"] = breach_at.isoformat()
        if removed:
            ms = int((changed_at - breach_at).total_seconds() * 1000)
            progress["breachToWeightChangeMs"] = max(0, ms)
    moved = ctx.move(
        to_state=RolloutState.ROLLING_BACK,
        event="rolling_back",
        why=why,
        values={"weight_permille": 0 if removed else rollout.weight_permille},
        progress=progress,
        data={k: v for k, v in progress.items() if k == "breachToWeightChangeMs"},
    )
    if moved and removed:
        return _rolling_back(ctx)
    return NUDGE_MS


# --- the registry's facts ------------------------------------------------------------------


def _active_id(ctx: _Ctx) -> Any:
    return (
        Fleet.objects.filter(pk=ctx.rollout.fleet_id)
        .values_list("active_domain_id", flat=True)
        .first()
    )


def _version(ctx: _Ctx) -> AdapterVersion | None:
    return AdapterVersion.objects.filter(
        fleet_id=ctx.rollout.fleet_id, name=ctx.candidate.adapter, version=ctx.candidate.version
    ).first()


def _active_copy(ctx: _Ctx, version: AdapterVersion) -> tuple[str, str]:
    """The state of the version's copy on the active domain (absent: none yet) and its why."""
    active = _active_id(ctx)
    if active is None:
        return CopyState.ABSENT.value, "the fleet has no active domain"
    copy = AdapterCopy.objects.filter(adapter=version, domain_id=active).first()
    if copy is None:
        return CopyState.ABSENT.value, ""
    return copy.state, copy.why


def _version_refused(ctx: _Ctx) -> str:
    """Why the candidate cannot serve now ("" when its copy on the active is probed)."""
    version = _version(ctx)
    if version is None:
        return f"{ctx.engine_name} is not in the registry"
    if version.state != AdapterVersionState.REGISTERED:
        return f"{ctx.engine_name} is {version.state}: {version.why}".rstrip(": ")
    state, why = _active_copy(ctx, version)
    if state != CopyState.PROBED:
        return f"{ctx.engine_name}'s copy on the active is {state}" + (f": {why}" if why else "")
    return ""


# --- the operator's checks -----------------------------------------------------------------


def _run_checks(ctx: _Ctx) -> CheckOutcome | None:
    """The operator's checks against the candidate on the active; None: no answer (away)."""
    checks = ctx.candidate.checks
    if not checks:
        return CheckOutcome(True)
    domain = Domain.objects.filter(pk=_active_id(ctx)).first()
    version = _version(ctx)
    if domain is None or version is None:
        return None
    client = ctx.client_for(domain)
    got: list[str | None] = []
    for check in checks:
        result = client.probe(
            prompt=check.prompt,
            max_tokens=check.max_tokens,
            timeout_ms=int(CALL_TIMEOUT_S * 900),
            models=[version.base_model],
            timeout=CALL_TIMEOUT_S,
            seed=GOLDEN_SEED,
            adapters={version.base_model: [ctx.engine_name]},
        )
        report = result.value
        if report is None:
            return None
        answer = report.result(version.base_model, ctx.engine_name)
        # Not golden (greedy, seeded): the answer is not one to judge.
        ok = answer is not None and answer.ok and report.golden
        got.append(answer.answer if ok and answer is not None else None)
    return checks_judge(CandidateKind.NEW_WEIGHTS, checks, got)


# --- the states ----------------------------------------------------------------------------


def _pending(ctx: _Ctx) -> int | None:
    ctx.move(
        to_state=RolloutState.PREPARING,
        event="preparing",
        why=f"waiting for {ctx.engine_name} to be probed on the active",
        values={"started_at": ctx.now},
        progress={"preparingAt": ctx.now.isoformat()},
    )
    return 0


def _preparing(ctx: _Ctx) -> int | None:
    version = _version(ctx)
    if version is None or version.state != AdapterVersionState.REGISTERED:
        return _roll_back(ctx, _version_refused(ctx))
    state, why = _active_copy(ctx, version)
    if state == CopyState.PROBED:
        ctx.move(
            to_state=RolloutState.CHECKING,
            event="checking",
            why=f"{ctx.engine_name} is probed on the active; checking its answers",
            progress={"checkingAt": ctx.now.isoformat()},
        )
        return 0
    if state in (CopyState.FAILED, CopyState.REMOVED):
        return _roll_back(ctx, _version_refused(ctx))
    waited = ctx.since("preparingAt") or 0
    limit_s = ctx.policy.adapter_rollout_prepare_timeout_ms / 1000
    if waited > limit_s:
        return _roll_back(
            ctx,
            f"{ctx.engine_name} was not probed on the active within {limit_s:.0f} s (its copy "
            f"there is {state}{': ' + why if why else ''})",
        )
    message = f"waiting for {ctx.engine_name} to be probed on the active (its copy is {state})"
    if message != ctx.rollout.why:
        ctx.move(event="waiting", why=message)
    return NUDGE_MS


def _checking(ctx: _Ctx) -> int | None:
    refused = _version_refused(ctx)
    if refused:
        return _roll_back(ctx, refused)
    outcome = _run_checks(ctx)
    if outcome is None:
        waited = ctx.since("checkingAt") or 0
        if waited > CHECK_DEADLINE_S:
            return _roll_back(ctx, f"the answer checks got no answer for {waited:.0f} s")
        return NUDGE_MS
    if not outcome.passed:
        # The route was never given the candidate: no user request reached it.
        return _roll_back(ctx, "answer check failed: " + outcome.message())
    ctx.move(event="checked", progress={"checkedStep": -1}, data={"step": -1})
    return _step_to(ctx, 0)


def _step_to(ctx: _Ctx, index: int) -> int | None:
    rollout = ctx.rollout
    steps = steps_parse(rollout.steps)
    step = steps[index]
    permille = weight_permille(step.weight)

    def stepped(route: AdapterRoute) -> AdapterRoute | None:
        return route_stepped(
            route,
            version=ctx.candidate.version,
            permille=permille,
            rollout_id=str(rollout.id),
            sticky_header=rollout.sticky_header,
        )

    try:
        written = _route_write(ctx, stepped, f"rollout {rollout.id} step {index}: {step.weight} %")
    except (_RouteGone, AdapterRouteInvalid) as exc:
        return _roll_back(ctx, f"the route cannot take the candidate: {exc}")
    if not written:
        return NUDGE_MS
    ctx.move(
        to_state=RolloutState.STEPPING,
        event="stepped",
        why=f"step {index + 1} of {len(steps)}: {step.weight} % to {ctx.engine_name}",
        values={"step_index": index, "weight_permille": permille, "step_started_at": clock.now()},
        data={"step": index, "weight": step.weight, "dwellS": step.dwell_s},
    )
    return NUDGE_MS


def _stepping(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    refused = _version_refused(ctx)
    if refused:
        # Its copy on the active failed, or a failover moved to a domain that has not probed
        # it: the proxies cannot route to it, so it goes off the route.
        return _roll_back(ctx, refused, breach_at=ctx.now)
    steps = steps_parse(rollout.steps)
    gates = gates_parse(rollout.gates)
    index = max(0, rollout.step_index)
    started = rollout.step_started_at or ctx.now
    if rollout.weight_permille >= 1000:
        # Every request goes to the candidate: no stable arm to compare with; the dwell only.
        decision = GateDecision(GateVerdict.PASS, "every request on the candidate")
    else:
        since = max(started, ctx.now - timedelta(seconds=gates.window_s))
        windows = ctx.reader(
            rollout_id=str(rollout.id), model=rollout.model, since=since, until=None
        )
        decision = gate_decide(windows, gates)
    if decision.verdict == GateVerdict.FAIL:
        return _roll_back(ctx, "gate failed: " + decision.reason, breach_at=ctx.now)
    dwelt = (ctx.now - started).total_seconds()
    if dwelt < steps[index].dwell_s or decision.verdict != GateVerdict.PASS:
        if ctx.progress("gateVerdict") != [index, decision.verdict.value]:
            ctx.move(
                event="gate",
                why=decision.reason if decision.verdict == GateVerdict.WAIT else None,
                progress={"gateVerdict": [index, decision.verdict.value], "gate": decision.figures},
                data={"step": index, "verdict": decision.verdict.value},
            )
        return NUDGE_MS
    if index + 1 >= len(steps):
        ctx.move(
            to_state=RolloutState.PROMOTING,
            event="promoting",
            why=f"every step passed its gates: {ctx.engine_name} becomes the route's version",
        )
        return _promoting(ctx)
    # The next step's checks run before its weight is set: a candidate gone bad is caught at
    # this step's weight, never given the larger share.
    if ctx.candidate.checks:
        outcome = _run_checks(ctx)
        if outcome is None:
            return NUDGE_MS
        if not outcome.passed:
            return _roll_back(
                ctx, "answer check failed: " + outcome.message(), breach_at=clock.now()
            )
        ctx.move(event="checked", progress={"checkedStep": index + 1}, data={"step": index + 1})
    return _step_to(ctx, index + 1)


def _promoting(ctx: _Ctx) -> int | None:
    """ONE compare-and-swap: the route names the candidate, alone (also a promote-early's)."""
    rollout = ctx.rollout
    number = ctx.candidate.version
    refused = _version_refused(ctx)
    if refused:
        return _roll_back(ctx, refused)

    def promoted(route: AdapterRoute) -> AdapterRoute | None:
        if owns(route, str(rollout.id)):
            return route_promoted(route, number)
        if route.version == number and route.candidate is None:
            return None  # written by an earlier look whose record was lost
        raise _RouteGone(f"the route of {rollout.model!r} moved under the rollout")

    try:
        written = _route_write(ctx, promoted, f"rollout {rollout.id}: {ctx.engine_name} serves")
    except (_RouteGone, AdapterRouteInvalid) as exc:
        return _roll_back(ctx, f"the route cannot take the candidate: {exc}")
    if not written:
        return NUDGE_MS
    moved = ctx.move(
        to_state=RolloutState.FINISHING,
        event="finishing",
        why=f"the route names {ctx.engine_name}; the previous version is left to retention",
        values={"weight_permille": 1000, "step_started_at": clock.now()},
        progress={"promotedAt": clock.now().isoformat()},
    )
    return _finishing(ctx) if moved else NUDGE_MS


def _finishing(ctx: _Ctx) -> int | None:
    ctx.move(
        to_state=RolloutState.SUCCEEDED,
        event="succeeded",
        why=f"{ctx.engine_name} serves every request for {ctx.candidate.adapter!r}",
    )
    return None


def _rolling_back(ctx: _Ctx) -> int | None:
    rollout = ctx.rollout
    try:
        removed = _route_write(
            ctx, _rolled_back(str(rollout.id)), f"rollout {rollout.id} rolled back"
        )
    except (_RouteGone, AdapterRouteInvalid):
        removed = True
    if not removed:
        return NUDGE_MS
    end = RolloutState.ABORTED if rollout.abort_requested else RolloutState.ROLLED_BACK
    ctx.move(to_state=end, event=end.value, why=rollout.why, values={"weight_permille": 0})
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


# --- automatic rollouts --------------------------------------------------------------------


def adapter_rollout_autostart(*, fleet: Fleet, policy: Policy, actor: str) -> Rollout | None:
    """Start the rollout of the newest probed version of a routed adapter, with the fleet's
    adapter plan, when nothing is in flight; at most one per call. Costs no query for a fleet
    without adapter routes or with `adapterRollout.auto` off."""
    if not policy.adapter_rollout_auto or not fleet.adapter_routes:
        return None
    try:
        routes = adapter_routes_parse(fleet.adapter_routes)
    except AdapterRouteInvalid:
        return None
    open_routes = {n: r for n, r in routes.items() if not r.pinned and r.candidate is None}
    if not open_routes or fleet.active_domain_id is None:
        return None
    rows = (
        AdapterVersion.objects.filter(
            fleet_id=fleet.id,
            name__in=list(open_routes),
            state=AdapterVersionState.REGISTERED.value,
            copies__domain_id=fleet.active_domain_id,
            copies__state=CopyState.PROBED.value,
        )
        .order_by("-version")
        .values_list("name", "version", "base_model")[:MAX_READY_ROWS]
    )
    newest: dict[str, int] = {}
    for name, number, base in rows:
        if base == open_routes[name].base and number > newest.get(name, 0):
            newest[name] = number
    if not newest:
        return None
    wanted = [(n, v) for n, v in newest.items() if v > open_routes[n].version]
    if not wanted:
        return None
    ever = Q()
    for name, number in wanted:
        ever |= Q(model=name, candidate__version=number)
    tried: dict[str, set[int]] = {}
    for name, candidate in Rollout.objects.filter(
        ever, fleet_id=fleet.id, candidate__kind=ADAPTER_KIND
    ).values_list("model", "candidate"):
        tried.setdefault(name, set()).add(int(candidate.get("version", 0)))
    picks = auto_candidates(open_routes, newest, {n: frozenset(v) for n, v in tried.items()})
    if not picks or rollout_in_flight(fleet.id) is not None:
        return None
    name, number = picks[0]
    try:
        return rollout_create(
            fleet=fleet,
            body={
                "candidate": {"kind": ADAPTER_KIND, "adapter": name, "version": number},
                "reason": f"automatic: {name}@v{number} is probed on the active",
                "stickyHeader": policy.adapter_rollout_sticky_header,
            },
            actor=actor,
        )
    except ServiceError as exc:
        # A race with an operator's rollout or pin: the next tick looks again.
        log.info("adapter rollout of %s@v%s not started: %s", name, number, exc.message)
        return None
