"""Rollouts: create one (every field checked, nothing changed on refusal), move it by
compare-and-swap, and the operator's actions (pause, resume, promote early, abort).

Every write is a guarded UPDATE on the rollout's `version` (and the state it read), with its
`rollout.*` event in the same transaction (`guarded_update`); no supervisor is called here: the
reconciler (fleets/reconciler/rollout.py) does that outside any transaction and records what
it learned through these services. The weight itself moves with the route revision
(`services.route_splits.route_split_set`), never here.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from common.wire.shape import FEATURE_MODEL_SWAP
from fleets.base import clock
from fleets.base.errors import (
    AdapterNotFound,
    InvalidRequest,
    InvalidTarget,
    RolloutConflict,
    RolloutNotFound,
)
from fleets.core.adapter_rollout import AdapterPlan, adapter_plan_parse, is_adapter
from fleets.core.adapter_route import AdapterRouteInvalid, adapter_routes_parse
from fleets.core.adapters import AdapterVersionState
from fleets.core.readiness import pick_standby
from fleets.core.report import read_report
from fleets.core.rollout import (
    FINAL_ROLLOUT_STATES,
    IN_FLIGHT_ROLLOUT_STATES,
    PAUSABLE,
    RolloutInvalid,
    RolloutPlan,
    RolloutState,
    check_rollout_transition,
    plan_parse,
)
from fleets.core.states import IN_FLIGHT_OPERATION_STATES, DomainState
from fleets.core.urls import scrub_urls, without_userinfo
from fleets.models import AdapterVersion, Domain, Fleet, Id, ModelBinding, Operation, Rollout
from fleets.reads.selectors import fleet_view
from fleets.services.events import EventFields, event_record, guarded_update

# A standby in one of these states cannot hold a candidate (a failing one the reconciler finds).
_GONE = frozenset({DomainState.FAILED, DomainState.STOPPING, DomainState.STOPPED})


def rollout_in_flight(fleet_id: Id) -> Rollout | None:
    """The fleet's rollout in flight, if any (at most one, by constraint)."""
    return (
        Rollout.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_ROLLOUT_STATES)
        .select_related("stable_domain", "candidate_domain")
        .first()
    )


def rollout_get(fleet_id: Id, rollout_id: str) -> Rollout:
    """The fleet's rollout `rollout_id`; RolloutNotFound for another fleet's or a malformed id."""
    try:
        key = uuid.UUID(str(rollout_id))
    except ValueError:
        key = None
    found = Rollout.objects.filter(pk=key, fleet_id=fleet_id).first() if key else None
    if found is None:
        raise RolloutNotFound(f"rollout {str(rollout_id)[:64]!r} not found in this fleet")
    return found


def _lacks_swap(domain: Domain) -> bool:
    """Whether the domain's last report says its supervisor cannot swap (no report yet: False;
    the reconciler checks again before its first call)."""
    status = read_report(domain.last_report).status
    return status is not None and FEATURE_MODEL_SWAP not in status.features


def rollout_create(*, fleet: Fleet, body: Any, actor: str) -> Rollout:
    """Start a rollout of one model of `fleet` through its standby.

    Raises, changing nothing: InvalidRequest (400, `field` named) for a body at fault or a
    model not bound on both arms; RolloutConflict (409) while a rollout, a promotion, a
    demotion or a drill is in flight; InvalidTarget (422) when the fleet has no active or no
    standby a failover would take, or a supervisor that cannot swap models.

    A candidate of kind "adapter" is an adapter rollout (`adapter_rollout_create`).
    """
    if isinstance(body, Mapping) and is_adapter(body.get("candidate")):
        return adapter_rollout_create(fleet=fleet, body=body, actor=actor)
    try:
        plan = plan_parse(body)
    except RolloutInvalid as exc:
        raise InvalidRequest(str(exc), field=exc.field) from None
    _refuse_in_flight(fleet.id)
    view = fleet_view(fleet)
    active = view.active
    if active is None:
        raise InvalidTarget("the fleet has no active domain to roll out from")
    standby = pick_standby(view, clock.now())
    if standby is None or standby.id == active.id or standby.state in _GONE:
        raise InvalidTarget(
            "the fleet has no standby a failover would take: a rollout runs its candidate there"
        )
    stable_binding = ModelBinding.objects.filter(domain_id=active.id, name=plan.model).first()
    cand_binding = ModelBinding.objects.filter(domain_id=standby.id, name=plan.model).first()
    if stable_binding is None or cand_binding is None:
        where = active.slug if stable_binding is None else standby.slug
        raise InvalidRequest(f"model: {plan.model!r} is not bound on {where}", field="model")
    if not cand_binding.profile or not stable_binding.profile:
        raise InvalidTarget(
            f"model {plan.model!r} has no profile in the layout: a rollout must be able to swap "
            "back to it"
        )
    domains = {d.id: d for d in Domain.objects.filter(pk__in=[active.id, standby.id])}
    for domain in domains.values():
        if _lacks_swap(domain):
            raise InvalidTarget(
                f"domain {domain.slug}'s supervisor does not list the feature "
                f"{FEATURE_MODEL_SWAP}: upgrade it before rolling out"
            )
    return _insert(fleet, plan, active.id, standby.id, stable_binding, cand_binding, actor)


def adapter_rollout_create(*, fleet: Fleet, body: Any, actor: str) -> Rollout:
    """Start the rollout of version N of an adapter already routed (fleets/core/adapter_rollout).

    Steps and gates the body leaves out come from the fleet's policy (`adapterRollout`). Raises,
    changing nothing: InvalidRequest (400) for a body at fault; AdapterNotFound (404) for a
    version the registry does not hold; InvalidTarget (422) for a name with no route yet (the
    registry routes a first version itself), a version of another base model, the version the
    route already names, a fleet with no active; RolloutConflict (409) while a rollout is in
    flight or the route is pinned or has a candidate. An operation in flight is no conflict:
    the versions live on every domain, and the route survives a pointer move.
    """
    policy = fleet_view(fleet).policy
    try:
        plan = adapter_plan_parse(
            body,
            default_steps=policy.adapter_rollout_steps,
            default_gates=policy.adapter_rollout_gates,
        )
    except RolloutInvalid as exc:
        raise InvalidRequest(str(exc), field=exc.field) from None
    name, number = plan.candidate.adapter, plan.candidate.version
    version = AdapterVersion.objects.filter(fleet_id=fleet.id, name=name, version=number).first()
    if version is None:
        raise AdapterNotFound(f"adapter {name!r} has no version {number} in this fleet")
    if version.state != AdapterVersionState.REGISTERED:
        raise InvalidTarget(f"{name}@v{number} is {version.state}: only a registered one serves")
    # Read now, not from the caller's row: the route moves with every step of other rollouts.
    fresh = Fleet.objects.filter(pk=fleet.id).values("adapter_routes", "active_domain_id").first()
    if fresh is None:
        raise InvalidTarget("the fleet is gone")
    try:
        route = adapter_routes_parse(fresh["adapter_routes"]).get(name)
    except AdapterRouteInvalid as exc:
        raise InvalidTarget(f"the fleet's adapter routes are unreadable: {exc}") from None
    if route is None:
        raise InvalidTarget(
            f"adapter {name!r} has no route yet: its first version is routed by the registry"
        )
    if version.base_model != route.base:
        raise InvalidTarget(
            f"{name}@v{number} was trained for {version.base_model!r}; the route serves "
            f"{route.base!r}"
        )
    if route.version == number:
        raise InvalidTarget(f"the route of {name!r} already names version {number}")
    if route.pinned:
        raise RolloutConflict(
            f"the route of {name!r} is pinned to v{route.version}: unpin it first"
        )
    if route.candidate is not None:
        raise RolloutConflict(
            f"the route of {name!r} already has candidate v{route.candidate} (rollout "
            f"{route.rollout_id})"
        )
    current = rollout_in_flight(fleet.id)
    if current is not None:
        raise RolloutConflict(
            f"rollout {current.id} of {current.model} is in flight ({current.state}); one at a "
            "time per fleet"
        )
    if fresh["active_domain_id"] is None:
        raise InvalidTarget("the fleet has no active domain to roll out on")
    return _adapter_insert(fleet, plan, route.as_json(), fresh["active_domain_id"], actor)


def _adapter_insert(
    fleet: Fleet, plan: AdapterPlan, route: Mapping[str, Any], active_id: Id, actor: str
) -> Rollout:
    now = clock.now()
    try:
        with transaction.atomic():
            rollout = Rollout.objects.create(
                fleet_id=fleet.id,
                model=plan.model,
                candidate=plan.candidate.as_json(),
                steps=[s.as_json() for s in plan.steps],
                gates=plan.gates.as_json(),
                sticky_header=plan.sticky_header,
                started_by=actor,
                state=RolloutState.PENDING,
                # The stable arm is whatever the pointer names at each look; this is where it
                # started. No candidate domain: the candidate is a version, on every domain.
                stable_domain_id=active_id,
                # The route as it was: a rollback leaves its version (and pin) as it was.
                previous={"route": dict(route)},
                why=plan.reason,
                created_at=now,
                updated_at=now,
            )
            event_record(
                fleet_id=fleet.id,
                kind="rollout.requested",
                actor=actor,
                data={
                    "rolloutId": str(rollout.id),
                    "model": plan.model,
                    "kind": "adapter",
                    "adapter": plan.candidate.adapter,
                    "version": plan.candidate.version,
                    "from": route.get("version"),
                    "steps": [s.as_json() for s in plan.steps],
                    "gates": plan.gates.as_json(),
                    "reason": plan.reason,
                },
            )
    except IntegrityError:
        current = rollout_in_flight(fleet.id)
        raise RolloutConflict(
            f"rollout {current.id if current else ''} is in flight; one at a time per fleet"
        ) from None
    return rollout


def _refuse_in_flight(fleet_id: Id) -> None:
    current = rollout_in_flight(fleet_id)
    if current is not None:
        raise RolloutConflict(
            f"rollout {current.id} of {current.model} is in flight ({current.state}); one at a "
            "time per fleet"
        )
    op = Operation.objects.filter(fleet_id=fleet_id, state__in=IN_FLIGHT_OPERATION_STATES).first()
    if op is not None:
        raise RolloutConflict(
            f"no rollout while an operation is in flight: {op.kind} of domain "
            f"{op.target_domain_slug} (operation {op.id}, state {op.state})"
        )


def _insert(
    fleet: Fleet,
    plan: RolloutPlan,
    stable_id: str,
    candidate_id: str,
    stable_binding: ModelBinding,
    cand_binding: ModelBinding,
    actor: str,
) -> Rollout:
    now = clock.now()
    try:
        with transaction.atomic():
            rollout = Rollout.objects.create(
                fleet_id=fleet.id,
                model=plan.model,
                candidate=plan.candidate.as_json(),
                swap_mode=plan.swap_mode.value,
                steps=[s.as_json() for s in plan.steps],
                gates=plan.gates.as_json(),
                sticky_header=plan.sticky_header,
                started_by=actor,
                state=RolloutState.PENDING,
                stable_domain_id=stable_id,
                candidate_domain_id=candidate_id,
                previous={
                    stable_id: {
                        "profile": stable_binding.profile,
                        "servingUrl": stable_binding.serving_url,
                    },
                    candidate_id: {
                        "profile": cand_binding.profile,
                        "servingUrl": cand_binding.serving_url,
                    },
                },
                why=plan.reason,
                created_at=now,
                updated_at=now,
            )
            # The other side of "never beside a promotion": an operation that got in between
            # our check and this insert wins, and this rollout is not created.
            if Operation.objects.filter(
                fleet_id=fleet.id, state__in=IN_FLIGHT_OPERATION_STATES
            ).exists():
                raise RolloutConflict("an operation started meanwhile; retry once it ended")
            event_record(
                fleet_id=fleet.id,
                kind="rollout.requested",
                actor=actor,
                domain_id=candidate_id,
                data={
                    "rolloutId": str(rollout.id),
                    "model": plan.model,
                    "kind": plan.candidate.kind.value,
                    "swapMode": plan.swap_mode.value,
                    "steps": [s.as_json() for s in plan.steps],
                    "gates": plan.gates.as_json(),
                    "stableDomainId": str(stable_id),
                    "candidateDomainId": str(candidate_id),
                    "reason": plan.reason,
                },
            )
    except IntegrityError:
        current = rollout_in_flight(fleet.id)
        raise RolloutConflict(
            f"rollout {current.id if current else ''} is in flight; one at a time per fleet"
        ) from None
    return rollout


def _event(rollout: Rollout, kind: str, actor: str, data: Mapping[str, Any]) -> EventFields:
    return {
        "fleet_id": rollout.fleet_id,
        "kind": f"rollout.{kind}",
        "actor": actor,
        "domain_id": rollout.candidate_domain_id,
        "data": {"rolloutId": str(rollout.id), "model": rollout.model, **data},
    }


def rollout_move(
    rollout: Rollout,
    *,
    to_state: str | None = None,
    actor: str,
    event: str,
    why: str | None = None,
    values: Mapping[str, Any] | None = None,
    progress: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
) -> bool:
    """Move `rollout` as read (its version and state) to `to_state` (None: stay) with
    `values` and `progress` merged in; record `rollout.<event>`. False: another writer moved
    it first, and nothing was written."""
    if to_state is not None and to_state != rollout.state:
        check_rollout_transition(rollout.state, to_state)
    now = clock.now()
    update: dict[str, Any] = {"version": F("version") + 1, "updated_at": now, **(values or {})}
    if to_state is not None:
        update["state"] = to_state
        if to_state in FINAL_ROLLOUT_STATES:
            update["finished_at"] = now
    if why is not None:
        why = scrub_urls(why)[:2000]  # a supervisor's words may quote a URL
        update["why"] = why
    if progress:
        update["progress"] = {**(rollout.progress or {}), **progress}
    guard = Rollout.objects.filter(pk=rollout.id, version=rollout.version, state=rollout.state)
    payload = {"from": rollout.state, "to": to_state or rollout.state, **(data or {})}
    if why:
        payload["why"] = why
    moved = guarded_update(guard, update, _event(rollout, event, actor, payload))
    if moved:
        rollout.refresh_from_db()
    return bool(moved)


# Operator actions: each refuses (RolloutConflict) what the state does not allow.


def _promotion_asked(rollout: Rollout) -> bool:
    """Whether the rollout's planned promotion was requested: routing is then moving (or has
    moved) to the candidate, and neither a pause nor an abort can hold it back."""
    return bool((rollout.progress or {}).get("promotionId"))


def _current(fleet_id: Id, rollout_id: str) -> Rollout:
    rollout = rollout_get(fleet_id, rollout_id)
    if rollout.state in FINAL_ROLLOUT_STATES:
        raise RolloutConflict(f"rollout {rollout.id} already ended ({rollout.state})")
    return rollout


def _retry(action: str) -> RolloutConflict:
    return RolloutConflict(f"the rollout moved while it was being {action}; retry")


def rollout_pause(*, fleet_id: Id, rollout_id: str, actor: str, why: str = "") -> Rollout:
    """Hold the rollout where it is and pin it: the weight stays, no step is taken, and no
    automatic rollback overrides the hold until it is resumed."""
    rollout = _current(fleet_id, rollout_id)
    if rollout.state == RolloutState.PAUSED:
        return rollout
    if rollout.state not in PAUSABLE:
        raise RolloutConflict(f"a rollout that is {rollout.state} cannot be paused")
    if _promotion_asked(rollout):
        raise RolloutConflict(
            "the planned promotion is under way: it cannot be paused (cancel the operation to "
            "stop it; the rollout then rolls back)"
        )
    moved = rollout_move(
        rollout,
        to_state=RolloutState.PAUSED,
        actor=actor,
        event="paused",
        why=why or f"paused by {actor}",
        values={"paused_from": rollout.state, "pinned": True},
        progress={"pausedBy": "operator"},
    )
    if not moved:
        raise _retry("paused")
    return rollout


def rollout_resume(*, fleet_id: Id, rollout_id: str, actor: str) -> Rollout:
    """Take a pause off: back where it was (its step's dwell starts again). A rollout paused by
    a failover, whose candidate is now the active, resumes into finishing: the old active, now
    the standby, is moved to the new version."""
    rollout = _current(fleet_id, rollout_id)
    if rollout.state != RolloutState.PAUSED:
        raise RolloutConflict(f"only a paused rollout resumes; this one is {rollout.state}")
    active = Fleet.objects.filter(pk=fleet_id).values_list("active_domain_id", flat=True).first()
    to_state = rollout.paused_from or RolloutState.STEPPING
    extra: dict[str, Any] = {}
    if active is not None and active == rollout.candidate_domain_id:
        to_state = RolloutState.FINISHING
        extra = {"weight_permille": 1000}
    elif (rollout.progress or {}).get("pausedBy") == "failover":
        raise RolloutConflict(
            "the fleet failed over mid-rollout and the candidate is not the active: abort it"
        )
    moved = rollout_move(
        rollout,
        to_state=to_state,
        actor=actor,
        event="resumed",
        why=f"resumed by {actor}",
        values={"paused_from": "", "pinned": False, "step_started_at": clock.now(), **extra},
    )
    if not moved:
        raise _retry("resumed")
    return rollout


def rollout_promote_early(*, fleet_id: Id, rollout_id: str, actor: str) -> Rollout:
    """Skip the remaining steps: the planned promotion of the candidate starts at once. Only
    once its answer checks passed (stepping, or paused while stepping)."""
    rollout = _current(fleet_id, rollout_id)
    stepping = rollout.state == RolloutState.STEPPING or (
        rollout.state == RolloutState.PAUSED and rollout.paused_from == RolloutState.STEPPING
    )
    if not stepping:
        raise RolloutConflict(
            f"only a rollout past its answer checks (stepping) can be promoted early; this one "
            f"is {rollout.state}"
        )
    moved = rollout_move(
        rollout,
        to_state=RolloutState.PROMOTING,
        actor=actor,
        event="promote_early",
        why=f"promoted early by {actor}",
        values={"paused_from": "", "pinned": False, "step_started_at": clock.now()},
    )
    if not moved:
        raise _retry("promoted")
    return rollout


def rollout_abort(*, fleet_id: Id, rollout_id: str, actor: str, why: str = "") -> Rollout:
    """Roll back at the operator's word: the weight goes to 0 at the reconciler's next look
    (one compare-and-swap), then the standby's old version and posture are restored; ends
    `aborted`. Refused once the promotion at 100 % has started: it cannot be unmoved."""
    rollout = _current(fleet_id, rollout_id)
    if rollout.state in (RolloutState.PROMOTING, RolloutState.FINISHING) or _promotion_asked(
        rollout
    ):
        raise RolloutConflict(
            f"a rollout that is {rollout.state} cannot be aborted: the promotion moves routing "
            "to the candidate; start a new rollout back to the old version afterwards"
        )
    if rollout.state == RolloutState.ROLLING_BACK:
        if rollout.abort_requested:
            return rollout
        moved = rollout_move(rollout, actor=actor, event="abort", values={"abort_requested": True})
    elif rollout.state == RolloutState.PENDING:
        # Nothing was touched yet: nothing to restore.
        moved = rollout_move(
            rollout,
            to_state=RolloutState.ABORTED,
            actor=actor,
            event="aborted",
            why=why or f"aborted by {actor}",
            values={"abort_requested": True},
        )
    else:
        moved = rollout_move(
            rollout,
            to_state=RolloutState.ROLLING_BACK,
            actor=actor,
            event="rolling_back",
            why=why or f"aborted by {actor}",
            values={"abort_requested": True, "pinned": False, "paused_from": ""},
            progress={"rollbackRequestedAt": clock.now().isoformat()},
        )
    if not moved:
        raise _retry("aborted")
    return rollout


def binding_serving_move(
    *,
    rollout: Rollout,
    domain_id: Id,
    expected_url: str,
    serving_url: str,
    profile: Mapping[str, Any],
    actor: str,
) -> bool:
    """Point the rollout's model on `domain_id` at the server a swap switched to (its URL as the
    status report told it, and its profile), if the binding still reads `expected_url`."""
    guard = ModelBinding.objects.filter(
        domain_id=domain_id, name=rollout.model, serving_url=expected_url
    )
    moved = guarded_update(
        guard,
        {"serving_url": serving_url, "profile": dict(profile)},
        {
            "fleet_id": rollout.fleet_id,
            "kind": "rollout.binding_moved",
            "actor": actor,
            "domain_id": domain_id,
            "data": {
                "rolloutId": str(rollout.id),
                "model": rollout.model,
                "from": without_userinfo(expected_url),
                "to": without_userinfo(serving_url),
            },
        },
    )
    return bool(moved)
