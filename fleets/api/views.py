"""API views: parse, call one service or selector, render. No business logic here."""

from __future__ import annotations

from collections.abc import Callable

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView
from rest_framework import serializers as drf_serializers
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.permissions import SAFE_METHODS
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from common.strict_json import type_name
from fleets.api import serializers as s
from fleets.api.auth import HasApiToken, request_grant
from fleets.api.errors import PayloadTooLarge
from fleets.base import clock
from fleets.base.errors import ErrorCode
from fleets.core.decisions import RequestStatus
from fleets.core.policy import Policy
from fleets.core.route_intent import build_route_intent
from fleets.core.states import OperationKind
from fleets.models import Domain, Fleet, Operation, Rollout
from fleets.reads import selectors, shapes
from fleets.reads.access import visible_fleets
from fleets.reads.adapters import adapter_get, fleet_adapters
from fleets.reads.fleet_list import FleetStatus, parse_status, search, with_status
from fleets.reads.readiness import fleet_readiness
from fleets.reads.recovery import recovery_report
from fleets.reads.rollouts import DEFAULT_ROLLOUTS, MAX_ROLLOUTS, fleet_rollouts, rollout_json
from fleets.reconciler.golden import record_baselines
from fleets.reconciler.supervisor.client import client_for
from fleets.reconciler.tick import fleet_reconcile
from fleets.services.adapter_pins import adapter_pin, adapter_unpin
from fleets.services.operations import operation_cancel_request, operation_request
from fleets.services.provisioning import domain_provision_begin, domain_stop_request
from fleets.services.rollouts import (
    rollout_abort,
    rollout_create,
    rollout_get,
    rollout_pause,
    rollout_promote_early,
    rollout_resume,
)

# Control bodies are a few bytes; refuse anything large before parsing it.
MAX_CONTROL_BODY = 64 * 1024
# GET .../operations?limit=: how many of the newest operations, by default and at most.
DEFAULT_OPERATIONS = 50
MAX_OPERATIONS = 500
# GET /v1/fleets?limit=: fleets in one page, by default and at most. An unbounded list is an
# unbounded answer (1,000 fleets); the default keeps small deployments on one page.
DEFAULT_FLEETS_PAGE = 100
MAX_FLEETS_PAGE = 1000
# Why a reconcile request did not run a tick: another held the fleet's lock past the wait.
TICK_LOCK_BUSY = "tick_lock_busy"

ERRORS = {
    code: OpenApiResponse(s.ErrorEnvelope, description=desc)
    for code, desc in {
        400: ErrorCode.INVALID_REQUEST.value,
        401: ErrorCode.UNAUTHORIZED.value,
        403: f"{ErrorCode.FORBIDDEN.value} (no role on this fleet for the caller, or a read "
        f"token on a write) or {ErrorCode.TOKEN_SCOPE.value} (a chat token)",
        404: f"{ErrorCode.FLEET_NOT_FOUND.value} (or {ErrorCode.ROLLOUT_NOT_FOUND.value}, "
        f"{ErrorCode.ADAPTER_NOT_FOUND.value})",
        409: f"{ErrorCode.OPERATION_CONFLICT.value}, {ErrorCode.PROVISION_REFUSED.value}, "
        f"{ErrorCode.OPERATION_FINISHED.value}, {ErrorCode.ROUTING_COMMITTED.value} or "
        f"{ErrorCode.ROLLOUT_CONFLICT.value}",
        413: ErrorCode.PAYLOAD_TOO_LARGE.value,
        422: ErrorCode.INVALID_TARGET.value,
        502: ErrorCode.SUPERVISOR_UNAVAILABLE.value,
    }.items()
}


def _errors(*codes: int) -> dict:
    # Whoever can be refused for want of a token can be refused for want of a role (403).
    codes = (*codes, 403) if 401 in codes else codes
    return {c: ERRORS[c] for c in sorted(codes)}


def _read(operation_id: str, summary: str, body, *errors: int):
    """The schema of a GET answered with `body` (200) or one of `errors`; the method's docstring
    is its description."""
    return extend_schema(
        summary=summary, operation_id=operation_id, responses={200: body, **_errors(*errors)}
    )


def _write(operation_id: str, summary: str, request, answers: dict, *errors: int, **more):
    """The schema of a POST that takes `request` (None: no body) and answers one of `answers`
    (status: body) or of `errors`; `more` passes on (a description where the method has no
    docstring)."""
    return extend_schema(
        summary=summary,
        request=request,
        operation_id=operation_id,
        responses={**answers, **_errors(*errors)},
        **more,
    )


class HaruAPIView(APIView):
    def initial(self, request: Request, *args, **kwargs):
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_CONTROL_BODY:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds {MAX_CONTROL_BODY}")
        super().initial(request, *args, **kwargs)
        # After authentication (above). A body is a JSON object or absent ({}), on every write
        # route, those that read none included: `null`, `[]` or `0` read as "no body" once,
        # and drills and baseline records ran on them.
        if request.method not in SAFE_METHODS and not isinstance(request.data, dict):
            raise ParseError(
                f"the request body must be a JSON object (or empty), got {type_name(request.data)}"
            )

    @staticmethod
    def actor(request: Request) -> str:
        user = request.user
        return f"api:{user}" if user is not None and str(user) else "api"


def _page_number(request: Request, name: str, default: int, most: int) -> int:
    """A non-negative integer query parameter, at most `most`; 400 for anything else."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise ParseError(f"{name} must be a whole number from 0 to {most}")
    return min(int(raw), most)


class FleetListView(HaruAPIView):
    @extend_schema(
        summary="List fleets",
        operation_id="listFleets",
        parameters=[
            OpenApiParameter(
                "limit",
                int,
                OpenApiParameter.QUERY,
                description=f"How many fleets in this page: 1 to {MAX_FLEETS_PAGE} (larger is "
                f"clamped). Follow `next` for the rest.",
                default=DEFAULT_FLEETS_PAGE,
            ),
            OpenApiParameter(
                "offset", int, OpenApiParameter.QUERY, description="Fleets to skip.", default=0
            ),
            OpenApiParameter(
                "q",
                str,
                OpenApiParameter.QUERY,
                description="Only fleets whose slug or display name contains this (any case).",
            ),
            OpenApiParameter(
                "status",
                str,
                OpenApiParameter.QUERY,
                enum=[st.value for st in FleetStatus],
                description="Only fleets that are `unhealthy` (health amber or red, as on the "
                "overview), `not_ready` (failover readiness verdict not_ready) or "
                "`in_operation` (an operation pending or running).",
            ),
        ],
        responses={200: s.FleetListOut, **_errors(400, 401)},
    )
    def get(self, request):
        """The fleets the caller may view, by slug, a page at a time, with each one's active
        domain and route revision; `count` is how many match, `next` the following page."""
        try:
            status = parse_status(request.query_params.get("status"))
        except ValueError as exc:
            raise ParseError(str(exc)) from None
        limit = max(1, _page_number(request, "limit", DEFAULT_FLEETS_PAGE, MAX_FLEETS_PAGE))
        offset = _page_number(request, "offset", 0, 10**9)
        fleets = search(
            visible_fleets(request_grant(request), Fleet.objects.order_by("slug")),
            request.query_params.get("q"),
        )
        if status is None:
            count = fleets.count()
            page = list(fleets[offset : offset + limit])
        else:
            chosen = with_status(fleets, status, clock.now())
            count, page = len(chosen), chosen[offset : offset + limit]

        def link(at: int) -> str:
            return replace_query_param(
                replace_query_param(request.build_absolute_uri(), "limit", limit), "offset", at
            )

        return Response(
            {
                "fleets": [shapes.fleet_summary_json(f) for f in page],
                "count": count,
                "limit": limit,
                "offset": offset,
                "next": link(offset + limit) if offset + limit < count else None,
                "previous": link(max(0, offset - limit)) if offset > 0 else None,
            }
        )


class FleetDetailView(HaruAPIView):
    @_read("getFleet", "Get a fleet", s.FleetDetailOut, 401, 404)
    def get(self, request, ref: str):
        """The fleet's snapshot: policy, domains with their health and models, the operation in
        flight, and the failover readiness verdict."""
        fleet = selectors.fleet_get(ref)
        snapshot = selectors.fleet_snapshot(fleet)
        return Response({**snapshot, "failoverReadiness": fleet_readiness(fleet).to_json()})


class RouteIntentView(HaruAPIView):
    @_read("getRouteIntent", "Get the route intent", s.RouteIntentOut, 401, 404)
    def get(self, request, ref: str):
        """Where traffic should go now, per model, for a router that routes on its own
        (docs/api.md, 'Route intent'), with the failover readiness verdict."""
        fleet = selectors.fleet_get(ref)
        view = selectors.fleet_view(fleet)
        now = clock.now()
        intent = build_route_intent(view, now, fleet.route_splits)
        # Routers can hold traffic policy on it (alert, or refuse a planned maintenance).
        intent["failoverReadiness"] = fleet_readiness(fleet, view, now).to_json()
        return Response(intent)


class _OperationRequestView(HaruAPIView):
    kind: str

    def post(self, request, ref: str):
        fleet = selectors.fleet_get(ref)
        body = s.TargetRequest(data=request.data)
        body.is_valid(raise_exception=True)
        result = operation_request(
            fleet=fleet,
            kind=self.kind,
            target_domain_id=body.validated_data["targetDomainId"],
            actor=self.actor(request),
        )
        if result.status == RequestStatus.ALREADY_ACTIVE:
            return Response(
                {
                    "status": RequestStatus.ALREADY_ACTIVE.value,
                    "routeRevision": result.route_revision,
                }
            )
        return Response(
            {
                "status": RequestStatus.ACCEPTED.value,
                "operation": shapes.operation_json(result.operation),
            },
            status=202,
        )


class PromoteView(_OperationRequestView):
    kind = OperationKind.PROMOTE

    @_write(
        "promoteDomain",
        "Promote a standby domain",
        s.TargetRequest,
        {200: s.AlreadyActiveOut, 202: s.AcceptedOut},
        *(400, 401, 404, 409, 413, 422),
        description="Start a promotion of `targetDomainId` (id or slug) to active: the "
        "reconciler drives its steps (stop_training, verify_gpu, wake, probe, switch_route, then "
        "the old active's demote_old_sleep and demote_old_train). 200 `already_active` when it "
        "is the active; 409 while another operation is in flight; 422 when the target cannot be "
        "promoted.",
    )
    def post(self, request, ref: str):
        return super().post(request, ref)


class DemoteView(_OperationRequestView):
    kind = OperationKind.DEMOTE

    @_write(
        "demoteDomain",
        "Demote a domain",
        s.TargetRequest,
        {202: s.AcceptedOut},
        *(400, 401, 404, 409, 413, 422),
        description="Start putting `targetDomainId` (id or slug) back into standby posture "
        "(sleep, start_training). 409 while another operation is in flight; 422 when the target "
        "cannot be demoted (the active, say).",
    )
    def post(self, request, ref: str):
        return super().post(request, ref)


class DrillView(HaruAPIView):
    @_write(
        "drillFleet",
        "Run a failover drill",
        s.DrillRequest,
        {202: s.AcceptedOut},
        *(400, 401, 404, 409, 413, 422),
    )
    def post(self, request, ref: str):
        """Run a failover drill now. Mode `check` (default): the standby stops training, wakes,
        passes its golden probe, sleeps and trains again; routing never moves. Mode
        `round_trip`: the standby is promoted and then the original active is promoted back
        (routing moves twice); refused (422) while autoFailover is off. Refused (409) while any
        operation is in flight and (422) while anything is degraded."""
        fleet = selectors.fleet_get(ref)
        body = s.DrillRequest(data=request.data)
        body.is_valid(raise_exception=True)
        result = operation_request(
            fleet=fleet,
            kind=OperationKind.DRILL,
            target_domain_id=body.validated_data.get("targetDomainId"),
            actor=self.actor(request),
            reason="manual_drill",
            drill_mode=body.validated_data["mode"],
        )
        return Response(
            {
                "status": RequestStatus.ACCEPTED.value,
                "operation": shapes.operation_json(result.operation),
            },
            status=202,
        )


class ReconcileView(HaruAPIView):
    @extend_schema(
        summary="Run one reconcile tick",
        request=None,
        operation_id="reconcileFleet",
        responses={
            200: inline_serializer(
                "ReconcileOut",
                {
                    "fleetId": drf_serializers.CharField(),
                    "ran": drf_serializers.BooleanField(),
                    "skipped": drf_serializers.ChoiceField(
                        choices=[TICK_LOCK_BUSY], allow_null=True
                    ),
                    "operation": s.OperationOut(allow_null=True),
                },
            ),
            **_errors(400, 401, 404),
        },
    )
    def post(self, request, ref: str):
        """Run one reconcile tick now; return the operation it advanced (or null).

        `ran: false, skipped: "tick_lock_busy"`: another tick held the fleet's lock past the
        wait, so this one did not run (the operation shown is what is in flight, if any)."""

        fleet = selectors.fleet_get(ref)
        result = fleet_reconcile(fleet_id=fleet.id)
        return Response(
            {
                "fleetId": str(fleet.id),
                "ran": result.ran,
                "skipped": None if result.ran else TICK_LOCK_BUSY,
                "operation": shapes.operation_json(result.operation()),
            }
        )


class BaselinesView(HaruAPIView):
    @_read("listBaselines", "List golden baselines", s.BaselineListOut, 401, 404)
    def get(self, request, ref: str):
        """The fleet's golden baselines: what each model and LoRA adapter answered when known
        good, per profile fingerprint and engine version."""
        fleet = selectors.fleet_get(ref)
        return Response({"baselines": [shapes.baseline_json(b) for b in fleet.baselines.all()]})

    @_write(
        "recordBaselines",
        "Record golden baselines",
        s.BaselineRecordRequest,
        {200: s.BaselineRecordOut},
        *(400, 401, 404, 413, 422, 502),
    )
    def post(self, request, ref: str):
        """Probe a serving domain (default: the active) and record its answers as the golden
        baselines, replacing any that differ: how an expected drift (an engine upgrade) is
        accepted. Each write is a `golden.baseline.recorded` event."""
        fleet = selectors.fleet_get(ref)
        body = s.BaselineRecordRequest(data=request.data)
        body.is_valid(raise_exception=True)
        domain = selectors.domain_or_active(fleet, body.validated_data.get("domainId"))
        done = record_baselines(
            domain=domain,
            policy=Policy.resolve(fleet.policy),
            actor=self.actor(request),
            client_for=client_for,
        )
        return Response(
            {
                "domain": domain.slug,
                "recorded": done.recorded,
                "unchanged": done.unchanged,
                "skipped": done.skipped,
            }
        )


class RecoveryView(HaruAPIView):
    @_read("getRecovery", "Get the published recovery time", s.RecoveryOut, 401, 404)
    def get(self, request, ref: str):
        """The published recovery time: p50/p95 of the last N drills and real failovers
        (automatic ones, and an operator's promotion away from a failed active) against the
        policy's rtoMs, and each sample's detection, steps and total."""
        return Response(recovery_report(selectors.fleet_get(ref)))


class _DomainActionView(HaruAPIView):
    """Ask for a provisioning move; the provisioning pass makes it (never this request)."""

    @staticmethod
    def move(*, domain: Domain, actor: str) -> bool:
        raise NotImplementedError

    def post(self, request, ref: str, domain: str) -> Response:
        """Make the move `move` names, answered 202 when the domain moved, 200 when it had."""
        fleet = selectors.fleet_get(ref)
        row = selectors.domain_get(fleet, domain)
        moved = self.move(domain=row, actor=self.actor(request))
        snapshot = selectors.fleet_snapshot(fleet)
        out = next(d for d in snapshot["domains"] if d["id"] == str(row.id))
        return Response(
            {
                "status": (RequestStatus.ACCEPTED if moved else RequestStatus.UNCHANGED).value,
                "domain": out,
            },
            status=202 if moved else 200,
        )


def _domain_action(operation_id: str, summary: str, description: str):
    """The schema of a provisioning move's POST: 202 when the domain moved, 200 when it
    already had (provision and stop answer alike)."""
    answers = {200: s.DomainActionOut, 202: s.DomainActionOut}
    errors = (400, 401, 404, 409, 413, 422)
    return extend_schema_view(
        post=_write(operation_id, summary, None, answers, *errors, description=description)
    )


@_domain_action(
    "provisionDomain",
    "Provision a domain",
    "Provision (or re-provision) a failed or stopped domain that Haru launches itself.",
)
class DomainProvisionView(_DomainActionView):
    @staticmethod
    def move(*, domain, actor: str) -> bool:
        return domain_provision_begin(domain_id=domain.id, actor=actor, reason="manual")


@_domain_action(
    "stopDomain",
    "Stop a provisioned standby",
    "Stop a standby that Haru provisioned: its cluster is stopped or torn down.",
)
class DomainStopView(_DomainActionView):
    @staticmethod
    def move(*, domain, actor: str) -> bool:
        return domain_stop_request(domain_id=domain.id, actor=actor)


class FleetOperationsView(HaruAPIView):
    @extend_schema(
        summary="List a fleet's operations",
        parameters=[
            OpenApiParameter(
                "limit",
                int,
                OpenApiParameter.QUERY,
                description=f"How many of the newest to return: 1 to {MAX_OPERATIONS} (a value "
                f"out of range is clamped; one that is not a number gives {DEFAULT_OPERATIONS}).",
                default=DEFAULT_OPERATIONS,
            )
        ],
        responses={200: s.OperationListOut, **_errors(401, 404)},
        operation_id="listFleetOperations",
    )
    def get(self, request, ref: str):
        """The fleet's operations (promote, demote, drill, failover), newest first, each with
        its steps, state and error."""
        fleet = selectors.fleet_get(ref)
        try:
            limit = int(request.query_params.get("limit", DEFAULT_OPERATIONS))
        except ValueError:
            limit = DEFAULT_OPERATIONS
        limit = max(1, min(limit, MAX_OPERATIONS))
        ops = Operation.objects.filter(fleet=fleet).order_by("-created_at")[:limit]
        return Response({"operations": [shapes.operation_json(op) for op in ops]})


class OperationCancelView(HaruAPIView):
    @_write(
        "cancelOperation",
        "Cancel an operation",
        None,
        {200: s.CancelledOut},
        *(400, 401, 404, 409, 413),
    )
    def post(self, request, ref: str, operation_id: str):
        """Cancel an in-flight operation of this fleet.

        The reconciler stops it between steps: a step already talking to a supervisor finishes
        its call, and routing never moves once the cancel is recorded. A cancelled promotion's
        target is put back in standby posture by the next tick (`cleanup` reads `pending` until
        then). A promotion that already moved routing cannot be un-moved: its remaining
        best-effort steps on the old active are skipped and it ends succeeded (`status`
        `succeeded`, `skippedSteps`). 409 `operation_finished` when it already ended; 409
        `routing_committed` in the moment between a promotion's switch and its record (retry).
        """
        fleet = selectors.fleet_get(ref)
        outcome = operation_cancel_request(
            fleet_id=fleet.id, operation_id=operation_id, actor=self.actor(request)
        )
        return Response(
            shapes.cancel_json(outcome.status, outcome.operation, outcome.skipped_steps)
        )


class OperationDetailView(HaruAPIView):
    @_read("getOperation", "Get an operation", s.OperationOut, 401, 404)
    def get(self, request, operation_id: str):
        """One operation of any fleet: its kind, state, steps with their durations, and error."""
        return Response(shapes.operation_json(selectors.operation_get(operation_id)))


class FleetRolloutsView(HaruAPIView):
    @extend_schema(
        summary="List a fleet's rollouts",
        parameters=[
            OpenApiParameter(
                "limit",
                int,
                OpenApiParameter.QUERY,
                description=f"How many of the newest: 1 to {MAX_ROLLOUTS}.",
                default=DEFAULT_ROLLOUTS,
            )
        ],
        responses={200: s.RolloutListOut, **_errors(401, 404)},
        operation_id="listFleetRollouts",
    )
    def get(self, request, ref: str):
        """The fleet's rollouts, newest first: state, weight, step, why, and progress."""
        fleet = selectors.fleet_get(ref)
        limit = _page_number(request, "limit", DEFAULT_ROLLOUTS, MAX_ROLLOUTS)
        return Response({"rollouts": [rollout_json(r) for r in fleet_rollouts(fleet.id, limit)]})

    @_write(
        "startRollout",
        "Start a rollout through the standby",
        s.RolloutRequest,
        {202: s.RolloutOut},
        *(400, 401, 404, 409, 413, 422),
    )
    def post(self, request, ref: str):
        """Start moving one model to a new version by way of the standby (docs/rollouts.md):
        the standby is swapped to the candidate profile and checked, then a growing share of
        the model's traffic goes to it, gated on errors, latency and answers; at 100 % it is
        promoted and the old active moved too. 400 `invalid_request` names the field at fault
        (`error.field`); 409 `rollout_conflict` while a rollout or an operation is in flight;
        422 `invalid_target` without a standby, or with a supervisor that cannot swap."""
        fleet = selectors.fleet_get(ref)
        rollout = rollout_create(fleet=fleet, body=request.data, actor=self.actor(request))
        return Response(rollout_json(rollout), status=202)


class RolloutDetailView(HaruAPIView):
    @_read("getRollout", "Get a rollout", s.RolloutOut, 401, 404)
    def get(self, request, ref: str, rollout_id: str):
        """One rollout of this fleet."""
        fleet = selectors.fleet_get(ref)
        return Response(rollout_json(rollout_get(fleet.id, rollout_id)))


# The operator's actions on a rollout: each answers the rollout as it now stands.
ROLLOUT_ACTIONS: dict[str, Callable[..., Rollout]] = {
    "pause": rollout_pause,
    "resume": rollout_resume,
    "promote": rollout_promote_early,
    "abort": rollout_abort,
}


class RolloutActionView(HaruAPIView):
    @_write(
        "actOnRollout",
        "Pause, resume, promote early or abort a rollout",
        None,
        {200: s.RolloutOut},
        *(400, 401, 404, 409, 413),
        parameters=[
            OpenApiParameter("action", str, OpenApiParameter.PATH, enum=sorted(ROLLOUT_ACTIONS))
        ],
    )
    def post(self, request, ref: str, rollout_id: str, action: str):
        """`pause` holds the weight where it is and pins the rollout (no automatic rollback
        overrides a pin); `resume` takes the pause off; `promote` skips the remaining steps (the
        planned promotion starts); `abort` rolls back (the weight to 0 in one compare-and-swap,
        then the standby's old version and posture restored). 409 `rollout_conflict` when the
        rollout's state refuses the action."""
        fleet = selectors.fleet_get(ref)
        act = ROLLOUT_ACTIONS.get(action)
        if act is None:
            raise NotFound(f"no rollout action {action[:32]!r}; one of {sorted(ROLLOUT_ACTIONS)}")
        rollout = act(fleet_id=fleet.id, rollout_id=rollout_id, actor=self.actor(request))
        return Response(rollout_json(rollout))


class FleetAdaptersView(HaruAPIView):
    @_read("listFleetAdapters", "List a fleet's adapters", s.AdapterListOut, 401, 404)
    def get(self, request, ref: str):
        """Every adapter name of the fleet (docs/adapters.md): its newest versions (state,
        digest, size, training facts, the copy on each domain), its route, its rollout in
        flight, and its freshness (`servedAgeS`: how old what users get is)."""
        fleet = selectors.fleet_get(ref)
        return Response({"adapters": fleet_adapters(fleet, clock.now())})


class AdapterDetailView(HaruAPIView):
    @_read("getAdapter", "Get one adapter of a fleet", s.AdapterOut, 401, 404)
    def get(self, request, ref: str, name: str):
        """One adapter name: as in the list. 404 `adapter_not_found` for a name neither the
        registry nor a route knows."""
        fleet = selectors.fleet_get(ref)
        return Response(adapter_get(fleet, name, clock.now()))


class AdapterPinView(HaruAPIView):
    @_write(
        "pinAdapter",
        "Pin an adapter's route to one version",
        s.AdapterPinRequest,
        {200: s.AdapterRouteOut},
        *(400, 401, 404, 409, 413, 422),
    )
    def post(self, request, ref: str, name: str):
        """One route write: the adapter's requests all go to `version`, and automatic adapter
        rollouts leave it alone until it is unpinned. 409 `rollout_conflict` while an adapter
        rollout of this name is in flight (abort it first); 404 `adapter_not_found` for an
        unknown name or version; 422 `invalid_target` for a version not probed on the
        active."""
        fleet = selectors.fleet_get(ref)
        route = adapter_pin(fleet=fleet, name=name, body=request.data, actor=self.actor(request))
        return Response(route.as_json())


class AdapterUnpinView(HaruAPIView):
    @_write(
        "unpinAdapter",
        "Take the pin off an adapter's route",
        None,
        {200: s.AdapterRouteOut},
        *(400, 401, 404, 409, 413),
    )
    def post(self, request, ref: str, name: str):
        """The route keeps its version; automatic adapter rollouts may move it again."""
        fleet = selectors.fleet_get(ref)
        return Response(adapter_unpin(fleet=fleet, name=name, actor=self.actor(request)).as_json())


class _ApiDocsMixin(APIView):
    """Guard the schema and the docs page like every other /v1/ route.

    drf-spectacular serves them to anyone by default (SERVE_PERMISSIONS); the schema tells an
    intruder what to call, so it needs the token (or a staff session) too. Errors render as the
    JSON envelope rather than the docs page's HTML template.
    """

    permission_classes = [HasApiToken]

    def handle_exception(self, exc):
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)


class SchemaView(_ApiDocsMixin, SpectacularJSONAPIView):
    pass


class DocsView(_ApiDocsMixin, SpectacularSwaggerView):
    pass
