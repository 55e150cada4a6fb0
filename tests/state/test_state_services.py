"""Services: every state change is a checked compare-and-swap that records an Event."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.base.errors import InvalidTarget, OperationConflict
from fleets.core.states import InvalidTransition
from fleets.models import Domain, Event, Fleet, Operation, Slot
from fleets.services import operations
from fleets.services.operations import (
    operation_cancel,
    operation_fail,
    operation_request,
    operation_start,
    operation_step_done,
)
from fleets.services.route_pointer import route_switch
from fleets.services.transitions import domain_transition, slot_transition
from tests.clocks import FakeClock

pytestmark = pytest.mark.django_db


def dom(fleet: Fleet, slug: str) -> Domain:
    return Domain.objects.get(fleet=fleet, slug=slug)


def slot_of(fleet: Fleet, slug: str, kind: str) -> Slot:
    return Slot.objects.get(domain__fleet=fleet, domain__slug=slug, kind=kind)


class RacingClock(FakeClock):
    """A clock that lets a concurrent writer in on its first read.

    The services read the row, then ask the clock for a timestamp, then issue the conditional
    UPDATE; running `interfere` at that moment is exactly a writer that won the race.
    """

    def __init__(self, interfere) -> None:
        super().__init__()
        self._interfere = interfere

    def now(self):
        if self._interfere is not None:
            interfere, self._interfere = self._interfere, None
            interfere()
        return super().now()


@pytest.fixture
def racing_clock():
    installed = []

    def install(interfere):
        fake = RacingClock(interfere)
        installed.append(clock.set_clock(fake))
        return fake

    yield install
    if installed:
        clock.set_clock(installed[0])


# --- domains -------------------------------------------------------------------------------


def test_domain_transition_moves_and_records_an_event(seeded_fleet):
    west = dom(seeded_fleet, "west")
    assert domain_transition(domain_id=west.id, to_state="degraded", actor="test", reason="slow")
    west.refresh_from_db()
    assert west.state == "degraded"
    event = Event.objects.get(kind="domain.degraded")
    assert event.domain_id == west.id
    assert event.fleet_id == seeded_fleet.id
    assert event.actor == "test"
    assert event.data == {"from": "ready", "to": "degraded", "reason": "slow"}


def test_refused_domain_pair_raises_and_writes_nothing(seeded_fleet):
    west = dom(seeded_fleet, "west")
    events = Event.objects.count()
    with pytest.raises(InvalidTransition):
        domain_transition(domain_id=west.id, to_state="stopped", from_states={"ready"})
    west.refresh_from_db()
    assert west.state == "ready"
    assert Event.objects.count() == events


def test_domain_not_in_a_source_state_is_left_alone(seeded_fleet):
    west = dom(seeded_fleet, "west")
    events = Event.objects.count()
    # ready cannot reach stopped directly; with no explicit sources the guard simply misses.
    assert domain_transition(domain_id=west.id, to_state="stopped") is False
    assert (
        domain_transition(domain_id=west.id, to_state="failed", from_states={"degraded"}) is False
    )
    assert domain_transition(domain_id=west.id, to_state="ready") is False  # already there
    west.refresh_from_db()
    assert west.state == "ready"
    assert Event.objects.count() == events


def test_domain_cas_lost_returns_false_and_keeps_the_winner(seeded_fleet, racing_clock):
    west = dom(seeded_fleet, "west")
    events = Event.objects.count()
    racing_clock(lambda: Domain.objects.filter(pk=west.id).update(state="failed"))
    assert domain_transition(domain_id=west.id, to_state="degraded", from_states={"ready"}) is False
    west.refresh_from_db()
    assert west.state == "failed"
    assert Event.objects.count() == events


def test_unknown_domain_is_not_moved(db):
    assert (
        domain_transition(domain_id="00000000-0000-0000-0000-000000000000", to_state="ready")
        is False
    )


# --- slots ---------------------------------------------------------------------------------


def test_slot_transition_moves_and_records_an_event(seeded_fleet):
    inf = slot_of(seeded_fleet, "west", "inference")
    assert slot_transition(slot_id=inf.id, to_state="waking", from_states={"sleeping"})
    inf.refresh_from_db()
    assert inf.state == "waking"
    event = Event.objects.get(kind="slot.inference.waking")
    assert event.data["slotId"] == str(inf.id)
    assert (event.data["from"], event.data["to"]) == ("sleeping", "waking")


def test_slot_transition_sets_extra_fields_in_the_same_update(seeded_fleet):
    train = slot_of(seeded_fleet, "west", "training")
    assert slot_transition(slot_id=train.id, to_state="training", extra={"pids": [4242]})
    train.refresh_from_db()
    assert (train.state, train.pids) == ("training", [4242])


def test_refused_slot_pair_raises_and_writes_nothing(seeded_fleet):
    inf = slot_of(seeded_fleet, "east", "inference")
    train = slot_of(seeded_fleet, "east", "training")
    events = Event.objects.count()
    with pytest.raises(InvalidTransition):
        slot_transition(slot_id=inf.id, to_state="probing", from_states={"serving"})
    with pytest.raises(InvalidTransition):
        slot_transition(slot_id=train.id, to_state="stopping", from_states={"idle"})
    inf.refresh_from_db()
    train.refresh_from_db()
    assert (inf.state, train.state) == ("serving", "idle")
    assert Event.objects.count() == events


def test_slot_cas_lost_returns_false(seeded_fleet, racing_clock):
    inf = slot_of(seeded_fleet, "west", "inference")
    racing_clock(lambda: Slot.objects.filter(pk=inf.id).update(state="failed"))
    assert slot_transition(slot_id=inf.id, to_state="waking", from_states={"sleeping"}) is False
    inf.refresh_from_db()
    assert inf.state == "failed"
    assert not Event.objects.filter(kind="slot.inference.waking").exists()


# --- operation requests --------------------------------------------------------------------


def test_promote_request_creates_a_pending_operation_capturing_the_source(seeded_fleet):
    east, west = dom(seeded_fleet, "east"), dom(seeded_fleet, "west")
    result = operation_request(
        fleet=seeded_fleet, kind="promote", target_domain_id=west.id, actor="alice"
    )
    assert (result.status, result.created, result.route_revision) == ("accepted", True, 1)
    op = result.operation
    assert (op.state, op.kind, op.target_domain_id) == ("pending", "promote", west.id)
    assert op.source_domain_id == east.id
    assert op.requested_by == "alice"
    assert op.routing_committed is False
    event = Event.objects.get(kind="operation.requested.promote")
    assert event.operation_id == op.id
    assert event.data["sourceDomainId"] == str(east.id)


def test_same_kind_and_target_joins_the_in_flight_operation(seeded_fleet):
    west = dom(seeded_fleet, "west")
    first = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
    operation_start(operation_id=first.operation.id)
    second = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
    assert (second.status, second.created) == ("accepted", False)
    assert second.operation.id == first.operation.id
    assert Operation.objects.count() == 1


def test_different_kind_or_target_conflicts_and_names_the_in_flight_operation(three_domain_fleet):
    fleet = three_domain_fleet
    west, north = dom(fleet, "west"), dom(fleet, "north")
    first = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id)
    for kind, target in (("promote", north.id), ("demote", west.id), ("demote", north.id)):
        with pytest.raises(OperationConflict) as caught:
            operation_request(fleet=fleet, kind=kind, target_domain_id=target)
        assert caught.value.operation.id == first.operation.id
        assert caught.value.code == "operation_conflict"
    assert Operation.objects.count() == 1


def test_promoting_the_active_is_a_no_op(seeded_fleet):
    east = dom(seeded_fleet, "east")
    result = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=east.id)
    assert (result.status, result.operation, result.route_revision) == ("already_active", None, 1)
    assert not Operation.objects.exists()


@pytest.mark.parametrize(
    ("kind", "make_invalid", "target", "message"),
    [
        ("promote", None, "nowhere", "is not in fleet"),
        ("promote", "failed", "west", "only ready or degraded"),
        ("promote", "unbound", "west", "has no model bindings"),
        ("demote", None, "east", "is the active domain"),
        ("demote", "failed", "west", "only ready or degraded"),
    ],
)
def test_refused_targets_raise_invalid_target_and_write_nothing(
    seeded_fleet, kind, make_invalid, target, message
):
    west = dom(seeded_fleet, "west")
    if make_invalid == "failed":
        Domain.objects.filter(pk=west.id).update(state="failed")
    elif make_invalid == "unbound":
        west.bindings.all().delete()
    target_id = dom(seeded_fleet, target).id if target != "nowhere" else "nowhere"
    events = Event.objects.count()
    with pytest.raises(InvalidTarget, match=message):
        operation_request(fleet=seeded_fleet, kind=kind, target_domain_id=target_id)
    assert not Operation.objects.exists()
    assert Event.objects.count() == events


def test_created_operation_sends_its_signal_after_commit_only(
    seeded_fleet, request, django_capture_on_commit_callbacks
):
    calls = []

    def heard(sender, *, fleet_id, operation_id, **_kwargs):
        calls.append((fleet_id, operation_id))

    operations.operation_created.connect(heard)
    request.addfinalizer(lambda: operations.operation_created.disconnect(heard))
    west = dom(seeded_fleet, "west")
    with django_capture_on_commit_callbacks(execute=False) as pending:
        created = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
        assert calls == []
    for callback in pending:
        callback()
    assert calls == [(str(seeded_fleet.id), str(created.operation.id))]
    with django_capture_on_commit_callbacks(execute=True):
        operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
    assert len(calls) == 1  # joining is not a new operation


# --- operation lifecycle -------------------------------------------------------------------


@pytest.fixture
def running_promote(seeded_fleet):
    west = dom(seeded_fleet, "west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    assert operation_start(operation_id=op.id)
    op.refresh_from_db()
    return op


def test_start_moves_pending_to_running_at_the_first_step_once(running_promote):
    assert (running_promote.state, running_promote.current_step) == ("running", "stop_training")
    assert running_promote.started_at is not None
    assert operation_start(operation_id=running_promote.id) is False
    assert Event.objects.filter(kind="operation.started").count() == 1


def test_finishing_the_same_step_twice_advances_once(running_promote):
    assert operation_step_done(operation_id=running_promote.id, step="stop_training")
    assert operation_step_done(operation_id=running_promote.id, step="stop_training") is False
    running_promote.refresh_from_db()
    assert running_promote.current_step == "verify_gpu"
    assert Event.objects.filter(kind="operation.step.done", step="stop_training").count() == 1


def test_last_step_succeeds_the_operation(seeded_fleet):
    west = dom(seeded_fleet, "west")
    op = operation_request(fleet=seeded_fleet, kind="demote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    assert operation_step_done(operation_id=op.id, step="sleep")
    assert operation_step_done(operation_id=op.id, step="start_training")
    op.refresh_from_db()
    assert (op.state, op.finished_at is not None) == ("succeeded", True)
    assert Event.objects.filter(kind="operation.succeeded", operation=op).exists()


def test_fail_records_the_error_and_undoes_the_targets_half_moves(seeded_fleet, running_promote):
    inf = slot_of(seeded_fleet, "west", "inference")
    train = slot_of(seeded_fleet, "west", "training")
    Slot.objects.filter(pk=inf.id).update(state="waking")
    Slot.objects.filter(pk=train.id).update(state="stopping")
    assert operation_fail(
        operation_id=running_promote.id, step="wake", code="step_timeout", message="slow"
    )
    running_promote.refresh_from_db()
    assert running_promote.state == "failed"
    assert running_promote.error == {"step": "wake", "code": "step_timeout", "message": "slow"}
    inf.refresh_from_db()
    train.refresh_from_db()
    assert (inf.state, train.state) == ("failed", "training")
    assert (
        operation_fail(operation_id=running_promote.id, step="wake", code="x", message="y") is False
    )


def test_cancel_stops_an_in_flight_operation(running_promote):
    assert operation_cancel(operation_id=running_promote.id, actor="bob")
    running_promote.refresh_from_db()
    assert running_promote.state == "cancelled"
    assert operation_cancel(operation_id=running_promote.id, actor="bob") is False


# --- the routing pointer -------------------------------------------------------------------


def switch(fleet: Fleet, op: Operation, **overrides):
    args = {
        "fleet_id": fleet.id,
        "operation_id": op.id,
        "target_domain_id": op.target_domain_id,
        "expected_active_id": op.source_domain_id,
        "expected_revision": 1,
    }
    args.update(overrides)
    return route_switch(**args)


def test_route_switch_moves_the_pointer_and_commits_routing(seeded_fleet, running_promote):
    west = dom(seeded_fleet, "west")
    assert switch(seeded_fleet, running_promote) == 2
    seeded_fleet.refresh_from_db()
    running_promote.refresh_from_db()
    assert (seeded_fleet.active_domain_id, seeded_fleet.route_revision) == (west.id, 2)
    assert running_promote.routing_committed is True
    event = Event.objects.get(kind="fleet.route.switched")
    assert event.data["revision"] == 2
    assert event.data["toDomainId"] == str(west.id)


def test_route_switch_moves_only_once_per_read_revision(seeded_fleet, running_promote):
    assert switch(seeded_fleet, running_promote) == 2
    assert switch(seeded_fleet, running_promote) is None  # same read: stale now
    seeded_fleet.refresh_from_db()
    assert seeded_fleet.route_revision == 2


def test_routing_committed_operation_cannot_be_failed_or_cancelled(seeded_fleet, running_promote):
    switch(seeded_fleet, running_promote)
    assert (
        operation_fail(operation_id=running_promote.id, step="probe", code="x", message="y")
        is False
    )
    assert operation_cancel(operation_id=running_promote.id, actor="bob") is False
    running_promote.refresh_from_db()
    assert running_promote.state == "running"


def _assert_pointer_untouched(fleet: Fleet) -> None:
    fleet.refresh_from_db()
    assert fleet.active_domain_id == dom(fleet, "east").id
    assert fleet.route_revision == 1
    assert not Operation.objects.filter(routing_committed=True).exists()
    assert not Event.objects.filter(kind="fleet.route.switched").exists()


def test_route_switch_refuses_a_pending_operation(seeded_fleet):
    west = dom(seeded_fleet, "west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    assert switch(seeded_fleet, op) is None
    _assert_pointer_untouched(seeded_fleet)


@pytest.mark.parametrize("ending", ["fail", "cancel"])
def test_route_switch_refuses_a_finished_operation(seeded_fleet, running_promote, ending):
    if ending == "fail":
        operation_fail(
            operation_id=running_promote.id, step="probe", code="probe_failed", message=""
        )
    else:
        operation_cancel(operation_id=running_promote.id, actor="bob")
    assert switch(seeded_fleet, running_promote) is None
    _assert_pointer_untouched(seeded_fleet)


def test_route_switch_refuses_a_running_demote(seeded_fleet):
    west = dom(seeded_fleet, "west")
    op = operation_request(fleet=seeded_fleet, kind="demote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    assert switch(seeded_fleet, op, expected_active_id=dom(seeded_fleet, "east").id) is None
    _assert_pointer_untouched(seeded_fleet)


@pytest.mark.parametrize("stale", ["revision", "pointer"])
def test_route_switch_refuses_a_stale_read(seeded_fleet, running_promote, stale):
    if stale == "revision":
        assert switch(seeded_fleet, running_promote, expected_revision=0) is None
        assert switch(seeded_fleet, running_promote, expected_revision=2) is None
    else:
        assert switch(seeded_fleet, running_promote, expected_active_id=None) is None
        wrong = dom(seeded_fleet, "west").id
        assert switch(seeded_fleet, running_promote, expected_active_id=wrong) is None
    _assert_pointer_untouched(seeded_fleet)


def test_route_switch_refuses_a_target_other_than_the_operations(seeded_fleet, running_promote):
    east = dom(seeded_fleet, "east")
    assert switch(seeded_fleet, running_promote, target_domain_id=east.id) is None
    _assert_pointer_untouched(seeded_fleet)


def test_route_switch_refuses_a_target_from_another_fleet(seeded_fleet, layout_data, apply_layout):
    other = apply_layout({**layout_data, "slug": "other"})
    foreign = dom(other, "west")
    # An operation row pointing across fleets can only be written by hand; the switch must
    # still refuse it, because the pointer would then name another fleet's domain.
    op = Operation.objects.create(
        fleet=seeded_fleet,
        kind="promote",
        state="running",
        current_step="switch_route",
        target_domain=foreign,
        source_domain=dom(seeded_fleet, "east"),
        created_at=clock.now(),
    )
    assert switch(seeded_fleet, op) is None
    _assert_pointer_untouched(seeded_fleet)
    other.refresh_from_db()
    assert other.route_revision == 1
