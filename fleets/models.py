"""The durable state: fleets, domains, slots, model bindings, operations and events.

State fields (`state`, `active_domain`, `route_revision`, `routing_committed`, ...) are moved
only by the compare-and-swap services in `fleets.services`; nothing calls save() on them and
admin shows them read-only. Invariants live in the database as constraints.
"""

from __future__ import annotations

import uuid
from typing import TypeAlias

from django.conf import settings
from django.db import models
from django.db.models import Q

from fleets.core.access import TokenScope
from fleets.core.adapters import AdapterVersionState, CopyState
from fleets.core.arm_stats import Arm
from fleets.core.model_health import ServerHealth
from fleets.core.rollout import IN_FLIGHT_ROLLOUT_STATES, RolloutState
from fleets.core.states import (
    CleanupState,
    DomainState,
    DrillMode,
    InferenceState,
    OperationKind,
    OperationState,
    Provider,
    SlotKind,
    TrainingState,
)
from fleets.core.supervisor_tls import TLS, TRANSPORTS
from fleets.drivers.registry import provider_names

# A primary key as the ORM returns it (UUID) or as a caller spells it (str).
Id: TypeAlias = uuid.UUID | str

# At most 63 characters (a DNS label), lowercase alphanumerics separated by single hyphens.
SLUG_REGEX = r"^(?=.{1,63}$)[a-z0-9]+(-[a-z0-9]+)*$"
# A provider's name, as the layout schema spells it (the registry's names all fit it).
PROVIDER_REGEX = r"^[a-z][a-z0-9-]{0,15}$"


def _choices(enum) -> list[tuple[str, str]]:
    return [(member.value, member.value) for member in enum]


class Fleet(models.Model):
    """One served set of models and the domains that can serve it: the unit of failover.

    Its layout fields (slug, policy, drill schedule) are written by the layout services
    (`layout_apply`, the admin's forms); `active_domain` and `route_revision` are the routing
    pointer, moved only by `services.route_pointer` in one conditional UPDATE, and the two rate
    stamps only by their guarded services. The database holds: the slug is a DNS label, the
    revision is positive, and the active domain cannot be deleted while it is active (PROTECT).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.CharField(max_length=63, unique=True)
    display_name = models.CharField(max_length=200, blank=True, default="")
    # Operator-set policy keys only; defaults are resolved on read (fleets.core.policy).
    policy = models.JSONField(default=dict, blank=True)
    # The routing pointer: the single source of truth for who serves. Moved only by
    # services.route_pointer.route_switch, in one statement with route_revision.
    active_domain = models.ForeignKey(
        "Domain",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        editable=False,
    )
    route_revision = models.BigIntegerField(default=1, editable=False)
    # Per served model, a weighted split of its traffic between the active (stable) and a
    # candidate domain (fleets/core/route_split.py): moved only with route_revision, by
    # services.route_splits, and cleared by every pointer move.
    route_splits = models.JSONField(default=dict, blank=True, editable=False)
    # Per adapter name, the version its requests get and, during an adapter rollout, the
    # candidate's share (fleets/core/adapter_route.py): moved only with route_revision, by
    # services.adapter_routes; a pointer move keeps them (the standby holds the same versions).
    adapter_routes = models.JSONField(default=dict, blank=True, editable=False, db_default={})
    # When the reconciler last reported "the active is lost and no standby can take over"
    # (null while the fleet is fine): the report is rate-limited across every process ticking
    # this fleet by a guarded update of this column (services/escalation.py).
    no_standby_reported_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The drill schedule (fleets/core/drills.py), set in admin: a check-only drill of the
    # standby every `drill_interval_minutes` (null: only when asked for), inside the daily UTC
    # window [start, end) (both null: any time; end <= start wraps midnight).
    drill_interval_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Run a drill this often (minutes); empty: never."
    )
    drill_window_start = models.TimeField(
        null=True, blank=True, help_text="Start of the daily drill window (UTC)."
    )
    drill_window_end = models.TimeField(
        null=True, blank=True, help_text="End of the daily drill window (UTC)."
    )
    # When a tick last probed the active for missing golden baselines (fleets/reconciler/
    # golden.py, `active_baselines_fill`): the probe is rate-limited per fleet across every
    # process by a guarded update of this column.
    baseline_probe_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What a scheduled drill proves (DrillMode): check only, or promote and promote back.
    drill_mode = models.CharField(
        max_length=16,
        choices=_choices(DrillMode),
        default=DrillMode.CHECK,
        db_default=DrillMode.CHECK.value,
        help_text="check: wake and probe the standby, routing never moves; round_trip: promote "
        "the standby and promote the active back (routing moves twice; needs autoFailover).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        # The per-fleet roles (fleets/core/access.py): held for every fleet as a model
        # permission, or for one fleet as a django-guardian object permission. `view_fleet`,
        # Django's default, is the third.
        permissions = [
            ("operate_fleet", "Can operate the fleet (promote, demote, drill, cancel, ...)"),
            ("administer_fleet", "Can administer the fleet (layout, deletion, access)"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(slug__regex=SLUG_REGEX), name="fleet_slug_valid"),
            models.CheckConstraint(
                condition=Q(route_revision__gt=0), name="fleet_route_revision_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Domain(models.Model):
    """One place a fleet can be served from: a supervisor (one host or cluster) and its GPUs.

    The layout fields are written by the layout services and the admin (`domain_add` for a new
    one); `state` moves only by `services.transitions.domain_transition` (a compare-and-swap on
    the old state), the heartbeat stamps and `last_report` only by `services.heartbeats`, and
    the provisioning fields only by `services.provisioning`, guarded by `provision_attempt`.
    The database holds: a slug unique in its fleet and a DNS label, a known state and provider.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="domains")
    slug = models.CharField(max_length=63)
    display_name = models.CharField(max_length=200, blank=True, default="")
    # static, or a provisioning driver's name: the registry (fleets/drivers/registry.py) is the
    # list, and the database holds it too (a new driver comes with the migration Django makes).
    provider = models.CharField(
        max_length=16, choices=[(name, name) for name in provider_names()], default=Provider.STATIC
    )
    # {cloud, region, accelerator, acceleratorCount, useSpot}
    placement = models.JSONField(default=dict, blank=True)
    supervisor_url = models.URLField(max_length=500, blank=True, default="")
    # How the supervisor is reached (fleets.core.supervisor_tls): "tls" (HTTPS beyond loopback)
    # or "plain-http" (asked for by name), and the SHA-256 pin of its certificate ("": trust a
    # CA instead). A provisioned domain's pin is the one its launch shipped.
    supervisor_transport = models.CharField(
        max_length=16, choices=[(t, t) for t in TRANSPORTS], default=TLS
    )
    supervisor_fingerprint = models.CharField(max_length=71, blank=True, default="")
    serving_base_url = models.URLField(max_length=500, blank=True, default="")
    # Lower is preferred when ranking standbys of a fleet with more than two domains.
    priority = models.PositiveIntegerField(default=100)
    state = models.CharField(
        max_length=16,
        choices=_choices(DomainState),
        default=DomainState.PROVISIONING,
        editable=False,
    )
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    state_updated_at = models.DateTimeField(editable=False)
    # The layout's GPU description, {gpus, placementPolicy, safetyMarginMiB}; empty when the
    # layout pins GPU indices by hand. The planner (fleets.core.placement) reads it.
    gpu_layout = models.JSONField(default=dict, blank=True)
    # Heartbeat scheduling, written only by the guarded services in services/heartbeats.py:
    # when the last heartbeat (good or bad) was recorded, since when it has been failing (null
    # while it succeeds), and when GPU memory was last asked for (reads are spaced from it).
    heartbeat_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    heartbeat_failing_since = models.DateTimeField(null=True, blank=True, editable=False)
    gpus_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The last supervisor report, normalized (`fleets.core.report`: written as
    # `DomainReport.to_json()`, read with `read_report`, which also reads rows written before
    # that form); shown, and read by readiness and the GPU plan: no state move decides on it.
    last_report = models.JSONField(default=dict, blank=True, editable=False)
    # Launch settings of a domain Haru provisions (checked by its driver); empty for a
    # static domain or one provisioned by hand.
    driver = models.JSONField(default=dict, blank=True)
    # Where provisioning stands (phase, candidate, request id, last driver error); written only
    # by fleets.services.provisioning, each write guarded by `provision_attempt`.
    driver_status = models.JSONField(default=dict, blank=True, editable=False)
    # Bumped by every claim of a provisioning move: the compare-and-swap token that lets exactly
    # one worker launch (or tear down) per attempt.
    provision_attempt = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["fleet", "priority", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["fleet", "slug"], name="domain_slug_unique_in_fleet"),
            models.CheckConstraint(condition=Q(slug__regex=SLUG_REGEX), name="domain_slug_valid"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in DomainState]), name="domain_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(provider__in=provider_names()), name="domain_provider_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.fleet.slug}/{self.slug}" if self.fleet_id else self.slug


class Slot(models.Model):
    """One GPU's place on a domain: an inference server (serves models) or a trainer.

    Created by the layout services (`slot_add`, which picks the first state by kind and the
    domain's role); `state` and `pids` move only through `services.transitions.slot_transition`
    and the heartbeat services, each a compare-and-swap on the state it read. The database
    holds: one slot per (domain, GPU, kind), a non-negative GPU index, and a state from its
    kind's own table (an inference state on a training slot is refused).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    domain = models.ForeignKey(Domain, on_delete=models.CASCADE, related_name="slots")
    gpu_index = models.IntegerField()
    kind = models.CharField(max_length=16, choices=_choices(SlotKind))
    state = models.CharField(max_length=16, editable=False)
    # inference: {sleepLevel, gpuType?, topology?};
    # training: {command, checkpointDir, memoryBudgetMiB?, gpuType?}
    spec = models.JSONField(default=dict, blank=True)
    # Every GPU the slot spans, first = gpu_index (a tensor-parallel server spans several).
    gpu_indices = models.JSONField(default=list, blank=True)
    # A MIG instance's name when the slot runs on one instance of gpu_index, else "".
    mig_instance = models.CharField(max_length=64, blank=True, default="")
    # What the plan granted: {pinned, servers: {name: {needMiB, gpuMemoryUtilization,
    # sleepResidueMiB}}} or {pinned, budgetMiB}; empty for a domain planned by hand.
    allocation = models.JSONField(default=dict, blank=True)
    # Last PIDs the supervisor reported for a training slot (a running trainer has one).
    pids = models.JSONField(default=list, blank=True, editable=False)
    state_updated_at = models.DateTimeField(editable=False)

    class Meta:
        ordering = ["domain", "gpu_index", "kind"]
        constraints = [
            models.UniqueConstraint(
                fields=["domain", "gpu_index", "kind"], name="slot_unique_gpu_kind"
            ),
            models.CheckConstraint(condition=Q(gpu_index__gte=0), name="slot_gpu_index_nonneg"),
            # A slot's state must belong to its kind's table.
            models.CheckConstraint(
                condition=(
                    Q(kind=SlotKind.INFERENCE, state__in=[s.value for s in InferenceState])
                    | Q(kind=SlotKind.TRAINING, state__in=[s.value for s in TrainingState])
                ),
                name="slot_kind_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.domain} gpu{self.gpu_index} {self.kind}"


class ModelBinding(models.Model):
    """A model a domain serves: the routing key clients send as `model`, on one inference slot.

    The layout services and the admin write what the layout says (name, URL, profile, memory,
    golden settings); the heartbeat services write what its server reports (`health`,
    `serving_seen_at`, `engine_version`), each guarded by the time it was last read. The chat
    proxy reads it to route. The database holds: a name unique in its domain, and lowercase.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    domain = models.ForeignKey(Domain, on_delete=models.CASCADE, related_name="bindings")
    slot = models.ForeignKey(Slot, on_delete=models.CASCADE, related_name="bindings")
    # The routing key: the lowercase served model name clients send as `model`.
    name = models.CharField(max_length=200)
    serving_url = models.URLField(max_length=500)
    # Engine profile (engine, model path, parallelism, ...) whose fingerprint the supervisor
    # reports, so a running server that no longer matches the layout is flagged.
    profile = models.JSONField(default=dict, blank=True)
    # The layout's memory request: {memoryMiB | memoryFraction, exclusive, sleepResidueMiB}.
    memory = models.JSONField(default=dict, blank=True)
    # The layout's golden-probe settings: {deterministic?: false, adapters?: [LoRA names]}.
    # db_default: replicas still on the previous release insert bindings without this column.
    golden = models.JSONField(default=dict, blank=True, db_default={})
    # Whether this model's own server takes requests (fleets.core.model_health): the proxy
    # refuses the model only when this says down, never for its supervisor or a neighbour.
    # Written by heartbeats through fleets.services.model_health, guarded by `health_at`.
    health = models.CharField(
        max_length=8, choices=_choices(ServerHealth), default=ServerHealth.UNKNOWN, editable=False
    )
    health_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The last time its server was seen able to serve: staleness of the supervisor alone never
    # fails over an active whose model servers were seen serving within the stale window.
    serving_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The engine version its server last reported (`engineVersion` in the supervisor's status;
    # "" until one did), and when that version was first seen: golden baselines are kept per
    # engine version, so a new one on the active is baselined before a standby's wake is judged.
    # Written by heartbeats through fleets.services.heartbeats, guarded by `engine_version_at`.
    engine_version = models.CharField(
        max_length=64, blank=True, default="", db_default="", editable=False
    )
    engine_version_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["domain", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["domain", "name"], name="binding_name_unique_in_domain"
            ),
            models.CheckConstraint(
                condition=Q(name__regex=r"^[^A-Z\s]+$"), name="binding_name_lowercase"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Operation(models.Model):
    """One promotion, demotion or drill of a fleet, run step by step by the reconciler.

    Requested by the API, the dashboard, the admin or the reconciler itself
    (`operation_request`); from then on every field (state, current step, routing flag, error,
    clean-up, times) is moved only by `services.operations`, each move a compare-and-swap on
    the state and step it read, and the admin shows it read-only. The database holds: at most
    one pending or running operation per fleet, a known state and a known kind.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="operations")
    kind = models.CharField(max_length=16, choices=_choices(OperationKind))
    state = models.CharField(
        max_length=16, choices=_choices(OperationState), default=OperationState.PENDING
    )
    # SET_NULL: a layout prune that removes the domain must not take the audit trail with it;
    # the slug copied at creation keeps naming it (an in-flight operation's target is never
    # pruned: the layout service refuses to prune while an operation is in flight).
    target_domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # db_default: replicas still running the previous release insert operations without this
    # column while the migration is applied (deploy/README.md, "Upgrading").
    target_domain_slug = models.CharField(max_length=63, blank=True, default="", db_default="")
    # The routing pointer captured when the operation was created: the domain a promotion
    # demotes afterwards, whatever the pointer says by then.
    source_domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    current_step = models.CharField(max_length=32, blank=True, default="")
    step_started_at = models.DateTimeField(null=True, blank=True)
    routing_committed = models.BooleanField(default=False)
    # When clients were served again: the moment a promotion's routing commit moved them to its
    # target, set in the same compare-and-swap as routing_committed (services/route_pointer.py).
    # The failover figure ends here (fleets/core/outage.py); the best-effort steps on the old
    # active that follow are not part of it.
    served_at = models.DateTimeField(null=True, blank=True)
    # {step, code, message} when the operation failed or was cancelled.
    error = models.JSONField(null=True, blank=True)
    # A failed or cancelled promotion's clean-up (CleanupState), recorded with the failure and
    # finished by whichever tick gets to it; the lease keeps two ticks from running it at once
    # and lets the next one take over from a worker that died mid-way.
    cleanup = models.CharField(
        max_length=16,
        blank=True,
        default="",  # CleanupState.NONE, spelt as stored so migrations need no enum
        db_default="",
        choices=_choices(CleanupState),
    )
    cleanup_lease_until = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=64, blank=True, default="manual")
    requested_by = models.CharField(max_length=150, blank=True, default="")
    # When the outage a promotion answers began: the first moment a client could not be served
    # (fleets.core.model_health.outage_started_at), kept when an automatic failover, or an
    # operator's promotion away from a failed active, is requested. The failover figure starts
    # here (fleets/core/outage.py).
    detected_at = models.DateTimeField(null=True, blank=True)
    # The old active's last good heartbeat when the operation was requested: with detected_at,
    # the measured detection time of a real failover (fleets/reads/recovery.py).
    source_seen_at = models.DateTimeField(null=True, blank=True)
    # The old active's state when the operation was requested: an operator's promotion away
    # from a failed active is a real failover, published as a recovery sample.
    source_state = models.CharField(max_length=16, blank=True, default="", db_default="")
    # A drill's DrillMode (empty for other kinds): which steps it runs.
    drill_mode = models.CharField(max_length=16, blank=True, default="", db_default="")
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # At most one pending/running operation per fleet; serves the in-flight lookup
            # `Operation.objects.filter(fleet=..., state__in=[pending, running])`.
            models.UniqueConstraint(
                fields=["fleet"],
                condition=Q(state__in=[OperationState.PENDING, OperationState.RUNNING]),
                name="uq_operation_one_inflight_per_fleet",
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in OperationState]),
                name="operation_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=[k.value for k in OperationKind]), name="operation_kind_valid"
            ),
        ]
        indexes = [models.Index(fields=["fleet", "-created_at"], name="operation_fleet_recent")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"

    @property
    def target_slug(self) -> str:
        """The target domain's slug, also after a prune removed the domain."""
        if self.target_domain_slug:
            return self.target_domain_slug
        target = self.target_domain if self.target_domain_id else None
        return target.slug if target is not None else ""


class GoldenBaseline(models.Model):
    """The answer a model (or one of its LoRA adapters) gave a golden probe when known good.

    Keyed per model, adapter, profile fingerprint, engine version and probe request: a changed
    profile, engine or probe legitimately changes the answer, so each gets its own baseline.
    Written only by services/baselines.py; every write is an event.
    """

    id = models.BigAutoField(primary_key=True)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="baselines")
    model_name = models.CharField(max_length=200)
    adapter = models.CharField(max_length=200, blank=True, default="")
    profile_fingerprint = models.CharField(max_length=64)
    engine_version = models.CharField(max_length=64, blank=True, default="")
    request_fingerprint = models.CharField(max_length=64)
    answer_sha256 = models.CharField(max_length=64)
    # The answer itself (bounded by the supervisor), so a mismatch shows expected against got.
    answer = models.TextField(blank=True, default="")
    # Where and why it was recorded; SET_NULL: a pruned domain keeps its fleet's baselines.
    domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=32)
    recorded_by = models.CharField(max_length=150, blank=True, default="")
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["fleet", "model_name", "adapter", "-recorded_at"]
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "fleet",
                    "model_name",
                    "adapter",
                    "profile_fingerprint",
                    "engine_version",
                    "request_fingerprint",
                ],
                name="golden_baseline_one_per_key",
            )
        ]

    def __str__(self) -> str:
        target = f"{self.model_name}:{self.adapter}" if self.adapter else self.model_name
        return f"{target} @ {self.engine_version or 'unknown engine'}"


class FleetArchive(models.Model):
    """What a deleted fleet leaves behind: its layout, operations and events, as JSON.

    Written by `fleet_delete` in the same transaction as the delete, so a fleet's history is
    never lost silently. Event retention does not touch archives.
    """

    id = models.BigAutoField(primary_key=True)
    fleet_id = models.UUIDField()
    slug = models.CharField(max_length=63)
    deleted_at = models.DateTimeField()
    deleted_by = models.CharField(max_length=150, blank=True, default="")
    layout = models.JSONField(default=dict)
    operations = models.JSONField(default=list)
    events = models.JSONField(default=list)

    class Meta:
        ordering = ["-deleted_at"]

    def __str__(self) -> str:
        return f"{self.slug} (deleted {self.deleted_at:%Y-%m-%d %H:%M:%S})"


class Event(models.Model):
    """An append-only audit row written after every successful transition."""

    id = models.BigAutoField(primary_key=True)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="events")
    domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=150, blank=True, default="")
    step = models.CharField(max_length=32, blank=True, default="")
    duration_ms = models.IntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        # Serves the dashboard timeline: newest events of one fleet.
        indexes = [models.Index(fields=["fleet", "-id"], name="event_fleet_recent")]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class ArmSample(models.Model):
    """One proxy process's figures for one arm of a split over one second.

    Written in the background by every proxy process (fleets/proxy/arm_stats.py: at most one
    row per rollout, model, arm and second per process, old rows deleted in the same flush)
    and summed over a window by fleets/reads/arm_stats.py for a rollout's gates. Tied to the
    rollout by its UUID alone: the samples outlive nothing and block no delete.
    """

    id = models.BigAutoField(primary_key=True)
    rollout_id = models.UUIDField()
    model = models.CharField(max_length=200)
    arm = models.CharField(max_length=16, choices=_choices(Arm))
    # The second the samples were taken in (UTC, truncated to the second).
    window_start = models.DateTimeField()
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    # Sparse log-bucket histograms in milliseconds (fleets/core/latency_histogram.py):
    # [[bucket, count], ...] of time to first token and of inter-token latency.
    ttft = models.JSONField(default=list)
    itl = models.JSONField(default=list)

    class Meta:
        indexes = [
            # The reader's window of one rollout's model; retention's oldest-first delete.
            models.Index(fields=["rollout_id", "model", "window_start"], name="armsample_window"),
            models.Index(fields=["window_start"], name="armsample_age"),
        ]

    def __str__(self) -> str:
        return f"{self.model} {self.arm} @ {self.window_start:%H:%M:%S}"


class Lease(models.Model):
    """A named claim with a deadline: one reconcile tick (or provisioning pass) per fleet.

    Taken and renewed by conditional UPDATEs (`fleets.services.leases`), so it needs no session
    state and works behind a transaction-mode pooler; a holder that freezes or dies simply stops
    renewing, and the next taker waits at most until `expires_at`. Not tied to the fleet by a
    foreign key: the name carries the purpose (`tick:<fleet id>`, `provision:<fleet id>`). A
    tick lease given back keeps the moment of release in `expires_at` (free either way), so the
    next tick knows how long the fleet went without a control plane.
    """

    name = models.CharField(primary_key=True, max_length=100)
    holder = models.CharField(max_length=100, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    # The row as it was before the last take, copied by the take's own UPDATE: the taker reads
    # whom it took over from and when the fleet was last held in that one statement (RETURNING)
    # instead of reading the row first.
    previous_holder = models.CharField(max_length=100, blank=True, default="")
    previous_expires_at = models.DateTimeField(null=True, blank=True)
    previous_acquired_at = models.DateTimeField(null=True, blank=True)
    # A tick lease's give-back keeps the good heartbeats its round heard that changed nothing
    # (domain id -> when, ISO 8601): such a beat writes no domain row, and every freshness
    # reader takes the later of this and the domain's `last_seen_at` (`fleets.reads.sightings`).
    # Written by the statement that gives the lease back, so it costs no statement or row.
    sightings = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or 'nobody'} until {self.expires_at}"


class ApiToken(models.Model):
    """A REST API token scoped to some fleets (or all) and to read or operate.

    Only the SHA-256 of the secret is kept: the secret is shown once, when the token is created
    (`manage.py api_token create`), and a lost one is revoked and replaced, never recovered.
    `prefix` (the secret's first characters, not enough to guess the rest) tells tokens apart
    in the admin and in audit events. The operator token (HARU_API_TOKEN) is not a row here.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=16, editable=False)
    secret_sha256 = models.CharField(max_length=64, unique=True, editable=False)
    scope = models.CharField(
        max_length=16, choices=_choices(TokenScope), default=TokenScope.READ.value
    )
    all_fleets = models.BooleanField(
        default=False, help_text="Every fleet, present and future; otherwise only those chosen."
    )
    fleets = models.ManyToManyField(Fleet, blank=True, related_name="api_tokens")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Written at most once a minute per token (services/access.py), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(scope__in=[s.value for s in TokenScope]), name="apitoken_scope_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Rollout(models.Model):
    """One model's move to a new version through the standby (fleets/core/rollout.py).

    Created by `services.rollouts.rollout_create`; from then on every field is moved only by
    the guarded services in `services.rollouts`, each a compare-and-swap on the `version` it
    read (and the state), and the admin shows it read-only. The database holds: at most one
    rollout in flight per fleet, a known state, a current weight within 0..1000 per mille.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="rollouts")
    # The served name it changes (a binding on both domains).
    model = models.CharField(max_length=200)
    # {kind: same-weights | new-weights, profile: {...} (the supervisor's swap body),
    #  checks: [{prompt, expect?, match?, maxTokens}]}
    candidate = models.JSONField(default=dict)
    swap_mode = models.CharField(max_length=16, default="new-port")
    # [{weight: percent, dwellS}], strictly increasing, the last 100.
    steps = models.JSONField(default=list)
    # {maxErrorRateDelta, ttftP95Ratio, itlP95Ratio, minSamples, windowS}
    gates = models.JSONField(default=dict)
    sticky_header = models.CharField(max_length=64, blank=True, default="")
    started_by = models.CharField(max_length=150, blank=True, default="")
    state = models.CharField(max_length=16, default=RolloutState.PENDING.value)
    # Where a pause came from: a resume goes back there.
    paused_from = models.CharField(max_length=16, blank=True, default="")
    # An operator's hold (set by pause, cleared by resume): no automatic rollback overrides it.
    pinned = models.BooleanField(default=False)
    # Set by an abort: the restore ends `aborted`, not `rolled_back`.
    abort_requested = models.BooleanField(default=False)
    step_index = models.IntegerField(default=-1)  # -1: no step yet
    weight_permille = models.IntegerField(default=0)
    # SET_NULL: a pruned domain keeps the rollout's record (its slug in `progress`).
    stable_domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    candidate_domain = models.ForeignKey(
        Domain, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # What the model served before, on each domain: {domainId: {profile, servingUrl}}; the
    # rollback swaps back to it.
    previous = models.JSONField(default=dict, blank=True)
    # Where each phase stands (swap requested, checks run at which step, the promotion's id,
    # the breach's time, ...): written with the state it belongs to.
    progress = models.JSONField(default=dict, blank=True)
    # The last reason the rollout moved (a gate's breach, an operator's word, a failure).
    why = models.TextField(blank=True, default="")
    # The compare-and-swap token: bumped by every write.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    step_started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["fleet"],
                condition=Q(state__in=sorted(s.value for s in IN_FLIGHT_ROLLOUT_STATES)),
                name="uq_rollout_one_inflight_per_fleet",
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in RolloutState]),
                name="rollout_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(weight_permille__gte=0, weight_permille__lte=1000),
                name="rollout_weight_permille_range",
            ),
        ]
        indexes = [models.Index(fields=["fleet", "-created_at"], name="rollout_fleet_recent")]

    def __str__(self) -> str:
        return f"rollout {self.model} {self.id} ({self.state})"


class AdapterVersion(models.Model):
    """One immutable version of a LoRA adapter a trainer produced (fleets/core/adapters.py).

    Registered by `services.adapters` from the manifest a trainer wrote
    (common/adapter_manifest.py); never edited after, except its `state` (retention, a refusal)
    by a guarded update. `version` counts up per fleet and adapter name and is never reused:
    the row of a retired version stays. The database holds: one (fleet, name, version), one
    digest per fleet and name.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="adapter_versions")
    # The adapter's name: what clients send as `model` (common.adapter_manifest.name_valid).
    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    # The served model (a binding's name) it was trained for, and that model's digest.
    base_model = models.CharField(max_length=200)
    base_model_digest = models.CharField(max_length=80, blank=True, default="")
    # `sha256:<hex>` over its files (common.adapter_manifest.adapter_digest), and their size.
    digest = models.CharField(max_length=71)
    size_bytes = models.BigIntegerField()
    # The manifest as the trainer wrote it (files, rank, target modules, eval answers,
    # training facts): the golden answers of the first probe come from here.
    manifest = models.JSONField()
    # Where it was trained: the domain and the checkpoint directory's name there.
    source_domain = models.ForeignKey(
        "Domain", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    checkpoint = models.CharField(max_length=200, blank=True, default="")
    # When the trainer completed it (from the manifest), and when Haru registered it.
    completed_at = models.DateTimeField()
    registered_at = models.DateTimeField()
    # When a user first got a token from it (the freshness figure's end), null until then.
    first_served_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(
        max_length=16,
        choices=_choices(AdapterVersionState),
        default=AdapterVersionState.REGISTERED.value,
    )
    why = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["fleet", "name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["fleet", "name", "version"], name="adapter_version_unique"
            ),
            models.UniqueConstraint(
                fields=["fleet", "name", "digest"], name="adapter_digest_unique"
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="adapter_version_positive"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in AdapterVersionState]),
                name="adapter_version_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}@v{self.version}"


class AdapterCopy(models.Model):
    """One adapter version's copy on one domain: transferred, stored, loaded, probed.

    Moved only by `services.adapters` (a compare-and-swap on `version_token`), from what the
    reconciler saw the domain's supervisor do; the proxy routes an adapter version only to a
    domain whose copy is `probed`.
    """

    id = models.BigAutoField(primary_key=True)
    adapter = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="copies")
    domain = models.ForeignKey("Domain", on_delete=models.CASCADE, related_name="adapter_copies")
    state = models.CharField(
        max_length=16, choices=_choices(CopyState), default=CopyState.ABSENT.value
    )
    # Bytes the domain's store holds of it (a transfer resumes from here).
    bytes_stored = models.BigIntegerField(default=0)
    # The answers its first passing probe gave (prompt -> answer): later probes compare to these.
    baseline = models.JSONField(default=dict, blank=True)
    loaded_at = models.DateTimeField(null=True, blank=True)
    probed_at = models.DateTimeField(null=True, blank=True)
    why = models.TextField(blank=True, default="")
    version_token = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["adapter", "domain"]
        constraints = [
            models.UniqueConstraint(fields=["adapter", "domain"], name="adapter_copy_unique"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in CopyState]),
                name="adapter_copy_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.adapter} on {self.domain_id} ({self.state})"
