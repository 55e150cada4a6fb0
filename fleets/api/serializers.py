"""Request and response shapes: they validate input and describe, for the OpenAPI schema, the
bodies `fleets/reads/shapes.py` renders (`tests/api/test_api_shapes.py` holds the two together)."""

from __future__ import annotations

from enum import StrEnum

from rest_framework import serializers

from fleets.core.decisions import RequestStatus
from fleets.core.golden import BaselineReason
from fleets.core.model_health import ServerHealth
from fleets.core.readiness import ReadinessCheck, ReadinessVerdict
from fleets.core.recovery import Detection, RecoveryKind
from fleets.core.states import (
    CleanupState,
    DomainRole,
    DomainState,
    DrillMode,
    OperationKind,
    OperationState,
    SlotKind,
)
from fleets.core.supervisor_tls import TRANSPORTS
from fleets.drivers.registry import provider_names


def _values(enum: type[StrEnum]) -> list[str]:
    """The choices of a field, in the enum's order, from the one place that names them."""
    return [member.value for member in enum]


class StrictSerializer(serializers.Serializer):
    """Refuse fields the contract does not name (the original API is strict)."""

    def validate(self, attrs):
        unknown = (
            sorted(set(self.initial_data) - set(self.fields))
            if isinstance(self.initial_data, dict)
            else []
        )
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        return attrs


class StrictCharField(serializers.CharField):
    """A JSON string and only that: DRF would otherwise coerce `7` into "7"."""

    default_error_messages = {"not_a_string": "must be a string"}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class TargetRequest(StrictSerializer):
    targetDomainId = StrictCharField(  # noqa: N815 - the public contract is camelCase
        max_length=100, help_text="The target domain's UUID or slug."
    )


class ErrorBody(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ErrorEnvelope(serializers.Serializer):
    error = ErrorBody()


class OperationError(ErrorBody):
    """Why an operation failed or was cancelled, and at which step."""

    step = serializers.CharField(help_text="The step it ended at (empty if it never started).")


class OperationOut(serializers.Serializer):
    id = serializers.UUIDField()
    fleetId = serializers.UUIDField()  # noqa: N815
    kind = serializers.ChoiceField(_values(OperationKind))
    state = serializers.ChoiceField(_values(OperationState))
    # Null once a layout prune removed the domain; the slug, copied at creation, stays.
    targetDomainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    targetDomainSlug = serializers.CharField(allow_null=True)  # noqa: N815
    sourceDomainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    currentStep = serializers.CharField(allow_null=True)  # noqa: N815
    stepStartedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    routingCommitted = serializers.BooleanField()  # noqa: N815
    servedAt = serializers.DateTimeField(  # noqa: N815
        allow_null=True,
        help_text="A promotion's routing commit: clients are served by its target from then on "
        "(the end of a failover's outage), while the operation may still be running its "
        "best-effort steps on the old active. Null until routing moved, and for other kinds.",
    )
    streamsContinued = serializers.IntegerField(  # noqa: N815
        allow_null=True,
        min_value=0,
        help_text="Streams the proxy continued on the new active after this operation moved "
        "routing: cut by the old active's crash, or moved by a planned promotion's bounded "
        "drain (policy streamMigrationAfterMs). Counted by the proxies on the host that "
        "answers, from the routing move to the fleet's next one (or now). Null when routing "
        "has not moved, or the count cannot be said (a proxy restarted since).",
    )
    error = OperationError(allow_null=True)
    cleanup = serializers.ChoiceField(
        [c.value for c in CleanupState if c.value],
        allow_null=True,
        help_text="A failed or cancelled promotion's clean-up of its target (sleep, restart "
        "training): pending until a tick finishes it; null when none is needed.",
    )
    drillMode = serializers.ChoiceField(  # noqa: N815
        _values(DrillMode),
        allow_null=True,
        help_text="A drill's mode (check or round_trip); null for other kinds.",
    )
    reason = serializers.CharField()
    requestedBy = serializers.CharField()  # noqa: N815
    createdAt = serializers.DateTimeField()  # noqa: N815
    startedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    finishedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815


class AcceptedOut(serializers.Serializer):
    status = serializers.ChoiceField([RequestStatus.ACCEPTED.value])
    operation = OperationOut()


class AlreadyActiveOut(serializers.Serializer):
    status = serializers.ChoiceField([RequestStatus.ALREADY_ACTIVE.value])
    routeRevision = serializers.IntegerField()  # noqa: N815


class ModelOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    servingUrl = serializers.URLField()  # noqa: N815
    profile = serializers.DictField(allow_null=True)
    memory = serializers.DictField(
        allow_null=True,
        help_text="The layout's memory request (memoryMiB or memoryFraction, "
        "exclusive, sleepResidueMiB); null when the layout gave none.",
    )
    health = serializers.ChoiceField(
        _values(ServerHealth),
        help_text="Whether this model's own server takes requests: the chat proxy refuses the "
        "model only when it is down (never for its supervisor or a neighbour on the slot).",
    )
    healthAt = serializers.DateTimeField(  # noqa: N815
        allow_null=True, help_text="When that health was observed."
    )
    servingSeenAt = serializers.DateTimeField(  # noqa: N815
        allow_null=True, help_text="When its server was last seen able to serve."
    )


class SlotOut(serializers.Serializer):
    id = serializers.UUIDField()
    gpuIndex = serializers.IntegerField()  # noqa: N815
    gpuIndices = serializers.ListField(  # noqa: N815
        child=serializers.IntegerField(),
        help_text="Every GPU the slot spans (a tensor-parallel server spans several).",
    )
    migInstance = serializers.CharField(  # noqa: N815
        allow_null=True, help_text="The MIG instance the slot runs on, if any."
    )
    kind = serializers.ChoiceField(_values(SlotKind))
    state = serializers.CharField()
    stateUpdatedAt = serializers.DateTimeField()  # noqa: N815
    spec = serializers.DictField()
    allocation = serializers.DictField(
        allow_null=True,
        help_text="What the GPU plan granted: per server needMiB, gpuMemoryUtilization and "
        "sleepResidueMiB, or a trainer's budgetMiB; null for a hand-placed slot.",
    )
    models = ModelOut(many=True, required=False)
    pids = serializers.ListField(child=serializers.IntegerField(), required=False)


class FailoverBackoffOut(serializers.Serializer):
    failures = serializers.IntegerField(
        help_text="Automatic promotions of this domain that failed (or were cancelled) in a row."
    )
    lastFailedAt = serializers.DateTimeField()  # noqa: N815
    nextAttemptAt = serializers.DateTimeField(  # noqa: N815
        help_text="Auto-failover does not pick this domain before then (policy "
        "failoverBackoffMs, doubling per failure up to failoverBackoffMaxMs)."
    )


class DomainOut(serializers.Serializer):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    displayName = serializers.CharField()  # noqa: N815
    role = serializers.ChoiceField(_values(DomainRole))
    provider = serializers.ChoiceField(list(provider_names()))
    placement = serializers.DictField()
    priority = serializers.IntegerField()
    supervisorUrl = serializers.URLField(allow_null=True)  # noqa: N815
    supervisorTransport = serializers.ChoiceField(  # noqa: N815
        list(TRANSPORTS),
        help_text="tls: https:// beyond loopback; plain-http: asked for by name, the token "
        "crosses the network in clear.",
    )
    supervisorFingerprint = serializers.CharField(  # noqa: N815
        allow_null=True,
        help_text="sha256:<hex> of the supervisor's certificate, trusted instead of a CA; null: "
        "a CA (HARU_SUPERVISOR_CA_BUNDLE or the system's) is.",
    )
    servingBaseUrl = serializers.URLField(allow_null=True)  # noqa: N815
    gpuLayout = serializers.DictField(  # noqa: N815
        allow_null=True,
        help_text="The layout's GPU description (gpus, placementPolicy, safetyMarginMiB); "
        "null when the layout places slots by hand.",
    )
    state = serializers.ChoiceField(_values(DomainState))
    lastSeenAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    stateUpdatedAt = serializers.DateTimeField()  # noqa: N815
    slots = SlotOut(many=True)
    # Only for a domain Haru provisions: phase, where, launches, lastError {code, message}.
    provisioning = serializers.DictField(allow_null=True)
    failoverBackoff = FailoverBackoffOut(allow_null=True)  # noqa: N815


class FleetSummaryOut(serializers.Serializer):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    displayName = serializers.CharField()  # noqa: N815
    activeDomainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    routeRevision = serializers.IntegerField()  # noqa: N815


class FleetListOut(serializers.Serializer):
    fleets = FleetSummaryOut(many=True)
    count = serializers.IntegerField(help_text="How many fleets match, on every page.")
    limit = serializers.IntegerField(help_text="The page's size, as applied.")
    offset = serializers.IntegerField(help_text="Fleets skipped before this page.")
    next = serializers.URLField(allow_null=True, help_text="The following page; null on the last.")
    previous = serializers.URLField(
        allow_null=True, help_text="The page before; null on the first."
    )


class FailoverDampingOut(serializers.Serializer):
    failovers = serializers.IntegerField(
        help_text="Automatic failovers whose routing committed within windowMs."
    )
    windowMs = serializers.IntegerField(help_text="Policy flapWindowMs.")  # noqa: N815
    holdDownMs = serializers.IntegerField(  # noqa: N815
        help_text="How long the active must stay lost before a further automatic failover "
        "(policy flapHoldDownMs, doubling past flapMaxFailovers)."
    )
    lastFailoverAt = serializers.DateTimeField()  # noqa: N815
    until = serializers.DateTimeField(help_text="When the damping ends.")


class FleetOut(FleetSummaryOut):
    policy = serializers.DictField()
    domains = DomainOut(many=True)
    operation = OperationOut(allow_null=True)
    failoverDamping = FailoverDampingOut(  # noqa: N815
        allow_null=True,
        help_text="Set while the fleet's automatic failovers are damped (it failed over "
        "flapMaxFailovers times within flapWindowMs): null otherwise.",
    )
    createdAt = serializers.DateTimeField()  # noqa: N815
    updatedAt = serializers.DateTimeField()  # noqa: N815


class ReadinessReasonOut(serializers.Serializer):
    check = serializers.ChoiceField(_values(ReadinessCheck))
    ok = serializers.BooleanField(allow_null=True, help_text="null: not known")
    accepted = serializers.BooleanField(
        help_text="Not proven, and the fleet's policy accepts it (readiness.acceptMissing): "
        "the verdict does not count it as a risk."
    )
    message = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True, help_text="When the fact was observed.")
    ageMs = serializers.IntegerField(allow_null=True)  # noqa: N815


class ReadinessOut(serializers.Serializer):
    verdict = serializers.ChoiceField(_values(ReadinessVerdict))
    standby = serializers.CharField(allow_null=True, help_text="The standby a failover takes.")
    evaluatedAt = serializers.DateTimeField()  # noqa: N815
    reasons = ReadinessReasonOut(many=True)


class FleetDetailOut(FleetOut):
    failoverReadiness = ReadinessOut()  # noqa: N815


class RouteModelOut(serializers.Serializer):
    name = serializers.CharField()
    servingUrl = serializers.URLField()  # noqa: N815
    eligible = serializers.BooleanField()


class RouteTargetOut(serializers.Serializer):
    domainId = serializers.UUIDField()  # noqa: N815
    domainSlug = serializers.CharField()  # noqa: N815
    endpointUrl = serializers.URLField(allow_null=True)  # noqa: N815
    eligible = serializers.BooleanField()
    weight = serializers.IntegerField()
    models = RouteModelOut(many=True)


class RouteSplitArmOut(serializers.Serializer):
    arm = serializers.ChoiceField(["stable", "candidate"])
    domainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    domainSlug = serializers.CharField(allow_null=True)  # noqa: N815
    servingUrl = serializers.URLField(allow_null=True)  # noqa: N815
    eligible = serializers.BooleanField()
    weight = serializers.IntegerField(
        help_text="relative weight, as the targets' weight; the two arms sum to 1000"
    )
    weightPermille = serializers.IntegerField(min_value=0, max_value=1000)  # noqa: N815


class RouteSplitOut(serializers.Serializer):
    model = serializers.CharField()
    rolloutId = serializers.UUIDField()  # noqa: N815
    stickyHeader = serializers.CharField(  # noqa: N815
        allow_null=True, help_text="null: the caller's API key is the stickiness key"
    )
    arms = RouteSplitArmOut(many=True)


class RouteSplitFaultOut(serializers.Serializer):
    model = serializers.CharField(allow_blank=True)
    problem = serializers.CharField()


class RouteIntentOut(serializers.Serializer):
    fleetId = serializers.UUIDField()  # noqa: N815
    fleetSlug = serializers.CharField()  # noqa: N815
    revision = serializers.IntegerField()
    generatedAt = serializers.DateTimeField()  # noqa: N815
    active = RouteTargetOut(allow_null=True)
    standbys = RouteTargetOut(many=True)
    splits = RouteSplitOut(
        many=True,
        required=False,
        help_text="only while a model's traffic is split (a rollout): absent otherwise",
    )
    splitFaults = RouteSplitFaultOut(  # noqa: N815
        many=True, required=False, help_text="stored splits that cannot be read (ignored)"
    )
    failoverReadiness = ReadinessOut()  # noqa: N815


class OperationListOut(serializers.Serializer):
    operations = OperationOut(many=True)


class CancelledOut(serializers.Serializer):
    status = serializers.ChoiceField(
        [OperationState.CANCELLED.value, OperationState.SUCCEEDED.value],
        help_text="cancelled: the operation ended cancelled (routing had not moved). succeeded: "
        "a promotion that had already moved routing ended without its remaining best-effort "
        "steps on the old active (listed in skippedSteps); routing stays where it moved.",
    )
    operation = OperationOut()
    skippedSteps = serializers.ListField(  # noqa: N815
        child=serializers.CharField(),
        help_text="The steps not run, in order (empty when cancelled); each is an "
        "operation.step.skipped event with reason cancelled.",
    )


class DomainActionOut(serializers.Serializer):
    status = serializers.ChoiceField([RequestStatus.ACCEPTED.value, RequestStatus.UNCHANGED.value])
    domain = DomainOut()


class DrillRequest(StrictSerializer):
    targetDomainId = StrictCharField(  # noqa: N815
        max_length=100,
        required=False,
        help_text="The standby to drill (UUID or slug); default the one a failover would take.",
    )
    mode = serializers.ChoiceField(
        _values(DrillMode),
        required=False,
        default=DrillMode.CHECK.value,
        help_text="check (default): the standby wakes and is probed, routing never moves; "
        "round_trip: promote the standby and promote the active back (routing moves twice; "
        "refused while autoFailover is off).",
    )


class BaselineRecordRequest(StrictSerializer):
    domainId = StrictCharField(  # noqa: N815
        max_length=100,
        required=False,
        help_text="The serving domain to record from (UUID or slug); default the active.",
    )


class BaselineOut(serializers.Serializer):
    model = serializers.CharField()
    adapter = serializers.CharField(allow_null=True)
    profileFingerprint = serializers.CharField()  # noqa: N815
    engineVersion = serializers.CharField(allow_null=True)  # noqa: N815
    requestFingerprint = serializers.CharField()  # noqa: N815
    answerSha256 = serializers.CharField()  # noqa: N815
    answer = serializers.CharField()
    domain = serializers.CharField(allow_null=True)
    reason = serializers.ChoiceField(_values(BaselineReason))
    recordedBy = serializers.CharField()  # noqa: N815
    recordedAt = serializers.DateTimeField()  # noqa: N815


class BaselineListOut(serializers.Serializer):
    baselines = BaselineOut(many=True)


class BaselineRecordOut(serializers.Serializer):
    domain = serializers.CharField()
    recorded = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    skipped = serializers.ListField(child=serializers.CharField())


class RecoverySampleOut(serializers.Serializer):
    kind = serializers.ChoiceField(_values(RecoveryKind))
    finishedAt = serializers.DateTimeField()  # noqa: N815
    detectionMs = serializers.IntegerField(  # noqa: N815
        help_text="A real failover (automatic, or an operator's promotion away from a failed "
        "active): from the outage's start (the first moment a client could not be served, "
        "recorded when the failover was requested) to the failover's start. A drill: 0."
    )
    detection = serializers.ChoiceField(
        _values(Detection),
        help_text="measured; bound (no timestamps: the policy's heartbeatStaleMs); none (a "
        "drill: nothing failed).",
    )
    stepsMs = serializers.DictField(child=serializers.IntegerField())  # noqa: N815
    totalMs = serializers.IntegerField(  # noqa: N815
        help_text="A real failover: its one figure, from the outage's start to the routing "
        "commit (servedAt), the same as its switch_route event's failoverMs; detectionMs and "
        "stepsMs are its parts. A drill: the sum of its steps."
    )


class RecoverySummaryOut(serializers.Serializer):
    kind = serializers.ChoiceField(_values(RecoveryKind))
    count = serializers.IntegerField()
    p50Ms = serializers.FloatField(allow_null=True)  # noqa: N815
    p95Ms = serializers.FloatField(allow_null=True)  # noqa: N815
    last = RecoverySampleOut(allow_null=True)


class RecoveryOut(serializers.Serializer):
    objectiveMs = serializers.IntegerField()  # noqa: N815
    window = serializers.IntegerField()
    overObjective = serializers.BooleanField()  # noqa: N815
    drill = RecoverySummaryOut()
    failover = RecoverySummaryOut()
    samples = RecoverySampleOut(many=True)


class RolloutRequest(serializers.Serializer):
    """A rollout to start (docs/rollouts.md); checked by fleets/core/rollout.py, which names
    the field at fault (400 `invalid_request`, `error.field`)."""

    model = serializers.CharField(help_text="The served model to move (bound on both arms).")
    candidate = serializers.JSONField(
        help_text='{"kind": "same-weights" | "new-weights", "profile": {...the new engine '
        'profile, as the supervisor swap takes it}, "checks": [{"prompt", "expect"?, "match"?: '
        '"substring" | "regex", "maxTokens"?}]}'
    )
    swapMode = serializers.ChoiceField(["new-port", "in-place"], required=False)  # noqa: N815
    steps = serializers.JSONField(
        required=False,
        help_text='[{"weight": percent, "dwellS": seconds}], strictly increasing, the last 100.',
    )
    gates = serializers.JSONField(
        required=False,
        help_text='{"maxErrorRateDelta", "ttftP95Ratio", "itlP95Ratio", "minSamples", "windowS"}',
    )
    stickyHeader = serializers.CharField(required=False, allow_blank=True)  # noqa: N815
    reason = serializers.CharField(required=False, allow_blank=True)


class RolloutOut(serializers.Serializer):
    id = serializers.UUIDField()
    fleetId = serializers.UUIDField()  # noqa: N815
    model = serializers.CharField()
    state = serializers.CharField()
    pausedFrom = serializers.CharField(allow_null=True)  # noqa: N815
    pinned = serializers.BooleanField(
        help_text="Held by an operator: never rolled back on its own."
    )
    abortRequested = serializers.BooleanField()  # noqa: N815
    candidate = serializers.JSONField()
    swapMode = serializers.CharField()  # noqa: N815
    steps = serializers.JSONField()
    gates = serializers.JSONField()
    stickyHeader = serializers.CharField()  # noqa: N815
    stepIndex = serializers.IntegerField()  # noqa: N815
    weightPermille = serializers.IntegerField()  # noqa: N815
    stableDomainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    candidateDomainId = serializers.UUIDField(allow_null=True)  # noqa: N815
    startedBy = serializers.CharField()  # noqa: N815
    why = serializers.CharField()
    promotionId = serializers.UUIDField(allow_null=True)  # noqa: N815
    breachToWeightChangeMs = serializers.IntegerField(allow_null=True)  # noqa: N815
    progress = serializers.JSONField()
    version = serializers.IntegerField()
    createdAt = serializers.DateTimeField()  # noqa: N815
    startedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    stepStartedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    finishedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    updatedAt = serializers.DateTimeField()  # noqa: N815


class RolloutListOut(serializers.Serializer):
    rollouts = RolloutOut(many=True)


class AdapterRouteOut(serializers.Serializer):
    """One adapter name's route (fleets/core/adapter_route.py)."""

    base = serializers.CharField(help_text="The served model the adapter runs on.")
    version = serializers.IntegerField(help_text="The version its requests get.")
    candidate = serializers.IntegerField(
        allow_null=True, help_text="A rollout's candidate version, taking weightPermille."
    )
    weightPermille = serializers.IntegerField()  # noqa: N815
    rollout = serializers.UUIDField(allow_null=True)
    stickyHeader = serializers.CharField(allow_blank=True)  # noqa: N815
    pinned = serializers.BooleanField(help_text="Automatic adapter rollouts leave it alone.")


class AdapterCopyOut(serializers.Serializer):
    domainId = serializers.UUIDField()  # noqa: N815
    domain = serializers.CharField()
    state = serializers.ChoiceField(
        ["absent", "transferring", "stored", "loaded", "probed", "failed", "removed"]
    )
    bytesStored = serializers.IntegerField()  # noqa: N815
    loadedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    probedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    why = serializers.CharField(allow_blank=True)


class AdapterVersionOut(serializers.Serializer):
    version = serializers.IntegerField()
    state = serializers.ChoiceField(["registered", "rejected", "retired"])
    why = serializers.CharField(allow_blank=True)
    digest = serializers.CharField()
    sizeBytes = serializers.IntegerField()  # noqa: N815
    baseModel = serializers.CharField()  # noqa: N815
    checkpoint = serializers.CharField(allow_blank=True)
    training = serializers.JSONField(help_text="The trainer's facts (steps, loss, ...), as sent.")
    rank = serializers.IntegerField(allow_null=True)
    completedAt = serializers.DateTimeField()  # noqa: N815
    registeredAt = serializers.DateTimeField()  # noqa: N815
    firstServedAt = serializers.DateTimeField(allow_null=True)  # noqa: N815
    copies = AdapterCopyOut(many=True)


class AdapterFreshnessOut(serializers.Serializer):
    servedVersion = serializers.IntegerField(allow_null=True)  # noqa: N815
    servedAgeS = serializers.FloatField(  # noqa: N815
        allow_null=True, help_text="Now minus the completion of the version the route names."
    )
    firstServedVersion = serializers.IntegerField(allow_null=True)  # noqa: N815
    checkpointToFirstTokenS = serializers.FloatField(  # noqa: N815
        allow_null=True,
        help_text="The newest served version's first token minus its completion.",
    )


class AdapterRolloutBriefOut(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    version = serializers.IntegerField()
    weightPermille = serializers.IntegerField()  # noqa: N815
    why = serializers.CharField(allow_blank=True)


class AdapterOut(serializers.Serializer):
    name = serializers.CharField()
    route = AdapterRouteOut(allow_null=True)
    rollout = AdapterRolloutBriefOut(allow_null=True)
    freshness = AdapterFreshnessOut(allow_null=True)
    versions = AdapterVersionOut(many=True, help_text="The newest versions first (at most 20).")


class AdapterListOut(serializers.Serializer):
    adapters = AdapterOut(many=True)


class AdapterPinRequest(serializers.Serializer):
    version = serializers.IntegerField(min_value=1, help_text="The version the route must name.")
