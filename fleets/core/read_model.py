"""Read-only views of persisted state that the pure core decides on.

The selectors build these from the database; the core never sees a Django model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from fleets.core.model_health import ServerHealth, outage_started_at
from fleets.core.policy import Policy
from fleets.core.states import DomainState, InferenceState, Provider, SlotKind


@dataclass(frozen=True)
class ModelView:
    name: str
    serving_url: str
    slot_id: str
    gpu_index: int
    slot_state: str  # the inference slot's state
    health: str = ServerHealth.UNKNOWN  # its own server's health
    serving_seen_at: datetime | None = None  # its server last seen able to serve


@dataclass(frozen=True)
class SlotView:
    id: str
    gpu_index: int
    kind: str
    state: str


@dataclass(frozen=True)
class DomainView:
    id: str
    slug: str
    state: str
    provider: str = Provider.STATIC
    priority: int = 0
    supervisor_url: str | None = None
    serving_base_url: str | None = None
    last_seen_at: datetime | None = None
    slots: tuple[SlotView, ...] = ()
    models: tuple[ModelView, ...] = ()
    state_since: datetime | None = None  # when it entered its state (state_updated_at)

    @property
    def has_bindings(self) -> bool:
        return bool(self.models)

    @property
    def serving_seen_at(self) -> tuple[datetime | None, ...]:
        """When each bound model's own server was last seen able to serve."""
        return tuple(m.serving_seen_at for m in self.models)

    def outage_started_at(self, first_failed_request: datetime | None = None) -> datetime | None:
        """The first moment a client could not be served by this domain: after its last good
        heartbeat and its model servers' last sightings, or at an earlier failed data-path
        request (fleets.core.model_health.outage_started_at); None when it was never seen."""
        return outage_started_at([self.last_seen_at, *self.serving_seen_at], first_failed_request)

    def lost_since(self, first_failed_request: datetime | None = None) -> datetime | None:
        """Since when this domain, lost as the active, has been unable to serve without a break.

        A failed one: since it went failed (a host that came back in between was ready or
        degraded, which restarts the count), else since its outage began. None: never seen.
        """
        if self.state == DomainState.FAILED and self.state_since is not None:
            return self.state_since
        return self.outage_started_at(first_failed_request)

    @property
    def has_failed_inference_slot(self) -> bool:
        return any(
            s.kind == SlotKind.INFERENCE and s.state == InferenceState.FAILED for s in self.slots
        )


@dataclass(frozen=True)
class FleetView:
    id: str
    slug: str
    active_domain_id: str | None
    route_revision: int
    policy: Policy
    domains: tuple[DomainView, ...] = field(default_factory=tuple)

    def domain(self, domain_id: str) -> DomainView | None:
        return next((d for d in self.domains if d.id == domain_id), None)

    @property
    def active(self) -> DomainView | None:
        return self.domain(self.active_domain_id) if self.active_domain_id else None

    @property
    def standbys(self) -> tuple[DomainView, ...]:
        return tuple(d for d in self.domains if d.id != self.active_domain_id)
