"""A promotion brought to its probe, and its switch committed, for the page tests that watch a
failover land (the snapshot test and the browser's live-page test)."""

from __future__ import annotations

from fleets.base import clock
from fleets.models import Domain, Fleet, Operation
from fleets.services.operations import operation_request, operation_start, operation_step_done
from fleets.services.route_pointer import route_switch


def promotion_at_probe(fleet: Fleet) -> tuple[Operation, Domain]:
    """Promote west, with every step before the probe done; return the operation and west."""
    Domain.objects.filter(fleet=fleet).update(last_seen_at=clock.now())
    west = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    for step in ("stop_training", "verify_gpu", "wake"):
        operation_step_done(operation_id=op.id, step=step)
    return op, west


def commit_switch(fleet: Fleet, op: Operation, west: Domain, east_id, revision: int) -> None:
    """The probe passes and the routing switch commits, as the reconciler records them."""
    operation_step_done(operation_id=op.id, step="probe")
    assert route_switch(
        fleet_id=fleet.id,
        operation_id=op.id,
        target_domain_id=west.id,
        expected_active_id=east_id,
        expected_revision=revision,
    )
    operation_step_done(operation_id=op.id, step="switch_route")
