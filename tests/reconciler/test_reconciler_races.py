"""Eight ticks of one fleet at once during a promotion: one outcome, each effect once.

Two layers are tested. Bare ticks (`fleet_tick`, no lock) prove correctness rests on the
conditional UPDATEs alone: the revision moves once and every step is recorded once, while the
scripted supervisor's idempotent calls may repeat without repeating their effect. Locked ticks
(`tick_run`, what the loop and Celery run) also keep the calls themselves to one each.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from fleets.core.states import PROMOTE_STEPS
from fleets.models import Event, Fleet, Operation
from fleets.reconciler.tick import fleet_tick, tick_run
from fleets.services.operations import operation_request

# PostgreSQL: the SQLite test database is in-memory with a shared cache, whose table locks
# ignore the busy timeout, so eight writers at once fail there for reasons of the test setup.
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 8


def in_flight() -> bool:
    return Operation.objects.filter(state__in=["pending", "running"]).exists()


def hammer(work) -> None:
    """Run `work()` on 8 threads released together, each repeating until nothing is in flight."""
    barrier = threading.Barrier(THREADS, timeout=30)

    def one(_):
        try:
            barrier.wait()
            for _ in range(200):
                work()
                if not in_flight():
                    return
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(one, range(THREADS)))


def start_promotion(fleet, tick):
    tick()  # one heartbeat first: the standby's trainer is mirrored as training
    west = fleet.domains.get(slug="west")
    return operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation


def assert_promoted_once(fleet, op, hosts):
    op.refresh_from_db()
    assert op.state == "succeeded", op.error
    fleet.refresh_from_db()
    assert fleet.route_revision == 2
    assert fleet.active_domain.slug == "west"
    done = list(
        Event.objects.filter(operation=op, kind="operation.step.done")
        .order_by("id")
        .values_list("step", flat=True)
    )
    assert done == list(PROMOTE_STEPS)
    assert Event.objects.filter(operation=op, kind="fleet.route.switched").count() == 1
    assert Event.objects.filter(operation=op, kind="operation.succeeded").count() == 1
    assert Event.objects.filter(operation=op, kind="operation.started").count() == 1
    east, west = hosts.hosts["east"], hosts.hosts["west"]
    assert west.effects["trainer_stopped"] == 1
    assert west.effects["woke"] == 2  # two models, each woken once
    assert east.effects["slept"] == 2
    assert east.effects["trainer_started"] == 1


def test_eight_bare_ticks_at_once_move_routing_once_and_record_each_step_once(
    fleet, tick, hosts, request
):
    op = start_promotion(fleet, tick)
    request.getfixturevalue("ticking_clock")  # after the first heartbeat: time passes from here
    hammer(lambda: fleet_tick(fleet_id=fleet.id, poll_s=0))
    assert_promoted_once(fleet, op, hosts)


def test_eight_locked_ticks_at_once_also_call_each_supervisor_route_once(
    fleet, tick, hosts, request
):
    op = start_promotion(fleet, tick)
    request.getfixturevalue("ticking_clock")
    hammer(lambda: tick_run(fleet_id=fleet.id, poll_s=0))
    assert_promoted_once(fleet, op, hosts)
    west, east = hosts.hosts["west"], hosts.hosts["east"]
    assert west.calls["POST /v1/training/stop"] == 1
    assert west.calls["POST /v1/vllm/wake"] == 1
    assert west.calls["POST /v1/probe"] == 1
    assert east.calls["POST /v1/vllm/sleep"] == 1
    assert east.calls["POST /v1/training/start"] == 1
    assert Fleet.objects.get(pk=fleet.pk).route_revision == 2
