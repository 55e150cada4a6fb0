"""Races on a real PostgreSQL: many writers at once, exactly one outcome.

Each test lines real threads up on a Barrier so their statements hit the database together; each
thread has its own connection (Django's are per thread) and closes it when done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleets.models import Domain, Event, Fleet, Operation
from fleets.services.operations import (
    operation_cancel,
    operation_fail,
    operation_finish_early,
    operation_request,
    operation_start,
    operation_step_done,
)
from fleets.services.route_pointer import route_switch

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 32


def run_together(count: int, work: Callable[[int], object]) -> list[object]:
    """Run work(0..count-1) on `count` threads released at once; return results in order."""
    barrier = threading.Barrier(count, timeout=30)

    def one(i: int):
        try:
            barrier.wait()
            return work(i)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def test_32_concurrent_promotes_create_exactly_one_operation(three_domain_fleet):
    fleet = three_domain_fleet
    west = Domain.objects.get(fleet=fleet, slug="west")
    north = Domain.objects.get(fleet=fleet, slug="north")
    # Half ask for west, half for north; each is addressed by slug and by id alike.
    targets = []
    for i in range(THREADS):
        domain = west if i % 2 == 0 else north
        targets.append(domain.slug if i % 4 < 2 else str(domain.id))

    def promote(i: int):
        response = APIClient().post(
            f"/v1/fleets/{fleet.slug}/promote", {"targetDomainId": targets[i]}, format="json"
        )
        return response.status_code, response.json()

    results = run_together(THREADS, promote)

    ops = list(Operation.objects.filter(fleet=fleet))
    assert len(ops) == 1
    winner = ops[0]
    assert winner.state == "pending"
    assert winner.source_domain_id == fleet.active_domain_id
    winner_target = west if winner.target_domain_id == west.id else north
    winner_ids = {winner_target.slug, str(winner_target.id)}
    for i, (status, body) in enumerate(results):
        if targets[i] in winner_ids:
            assert status == 202, body
            assert body["status"] == "accepted"
            assert body["operation"]["id"] == str(winner.id)
        else:
            assert status == 409, body
            assert body["error"]["code"] == "operation_conflict"
            assert body["error"]["operation"]["id"] == str(winner.id)
    assert Event.objects.filter(kind="operation.requested.promote").count() == 1


@pytest.mark.parametrize("writers", [2, 8])
def test_pointer_moves_from_one_read_revision_have_exactly_one_winner(seeded_fleet, writers):
    fleet = seeded_fleet
    east = Domain.objects.get(fleet=fleet, slug="east")
    west = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    read = Fleet.objects.get(pk=fleet.id)  # every writer acts on this one read

    def move(_i: int):
        return route_switch(
            fleet_id=fleet.id,
            operation_id=op.id,
            target_domain_id=west.id,
            expected_active_id=read.active_domain_id,
            expected_revision=read.route_revision,
        )

    results = run_together(writers, move)

    assert sorted(results, key=lambda r: r is None) == [2] + [None] * (writers - 1)
    fleet.refresh_from_db()
    assert (fleet.active_domain_id, fleet.route_revision) == (west.id, read.route_revision + 1)
    assert read.active_domain_id == east.id
    assert Event.objects.filter(kind="fleet.route.switched").count() == 1


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_switch_racing_a_failure_or_a_cancel_never_both_moves_and_ends(seeded_fleet, ending):
    fleet = seeded_fleet
    for _round in range(10):
        fleet.refresh_from_db()
        target = Domain.objects.filter(fleet=fleet).exclude(pk=fleet.active_domain_id).get()
        op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation
        operation_start(operation_id=op.id)
        before = (fleet.active_domain_id, fleet.route_revision)

        def act(i: int, op=op, target=target, before=before):
            if i == 0:
                return route_switch(
                    fleet_id=fleet.id,
                    operation_id=op.id,
                    target_domain_id=target.id,
                    expected_active_id=before[0],
                    expected_revision=before[1],
                )
            if ending == "cancelled":
                return operation_cancel(operation_id=op.id, actor="ops")
            return operation_fail(operation_id=op.id, step="probe", code="probe_failed", message="")

        switched, failed = run_together(2, act)

        op.refresh_from_db()
        fleet.refresh_from_db()
        assert (switched is not None) != failed
        if switched is not None:
            assert (op.state, op.routing_committed) == ("running", True)
            assert (fleet.active_domain_id, fleet.route_revision) == (target.id, before[1] + 1)
            # Test scaffolding: finish the operation so the next round may start one.
            Operation.objects.filter(pk=op.id).update(state="succeeded")
        else:
            assert (op.state, op.routing_committed) == (ending, False)
            assert op.cleanup == "pending"
            assert (fleet.active_domain_id, fleet.route_revision) == before


def test_ending_a_committed_promotion_early_racing_its_own_steps_records_each_step_once(
    seeded_fleet,
):
    fleet = seeded_fleet
    best_effort = ("demote_old_sleep", "demote_old_train")
    for _round in range(10):
        fleet.refresh_from_db()
        target = Domain.objects.filter(fleet=fleet).exclude(pk=fleet.active_domain_id).get()
        op = operation_request(fleet=fleet, kind="promote", target_domain_id=target.id).operation
        operation_start(operation_id=op.id)
        Operation.objects.filter(pk=op.id).update(current_step="switch_route")
        assert route_switch(
            fleet_id=fleet.id,
            operation_id=op.id,
            target_domain_id=target.id,
            expected_active_id=fleet.active_domain_id,
            expected_revision=fleet.route_revision,
        )
        assert operation_step_done(operation_id=op.id, step="switch_route")

        def act(i: int, op=op):
            if i == 0:  # the executors, finishing both best-effort steps
                return [operation_step_done(operation_id=op.id, step=s) for s in best_effort]
            return operation_finish_early(operation_id=op.id, actor="ops", reason="preempted")

        results = run_together(8, act)

        op.refresh_from_db()
        assert op.state == "succeeded"
        assert Event.objects.filter(operation=op, kind="operation.succeeded").count() == 1
        for step in best_effort:
            kinds = list(
                Event.objects.filter(
                    operation=op,
                    step=step,
                    kind__in=["operation.step.done", "operation.step.skipped"],
                ).values_list("kind", flat=True)
            )
            assert len(kinds) == 1, (step, kinds)
        assert sum(1 for r in results[1:] if r) <= 1  # at most one early end won
