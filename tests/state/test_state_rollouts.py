"""Rollout services on the state store: one in flight per fleet (the database holds it), every
move a compare-and-swap on the version read, and a rollout never beside a promotion. Runs on
SQLite and, with DATABASE_URL, on PostgreSQL (the race at the end needs PostgreSQL)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from fleets.base.errors import RolloutConflict
from fleets.models import Event, Rollout
from fleets.services.operations import operation_request
from fleets.services.rollouts import rollout_create, rollout_move, rollout_pause

PROFILE = {"engine": "sim", "extraArgs": ["--ttft-ms", "40"]}
BODY = {
    "model": "qwen-small",
    "candidate": {"kind": "same-weights", "profile": PROFILE},
    "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
}


@pytest.mark.django_db
def test_the_database_holds_one_rollout_in_flight_per_fleet(seeded_fleet):
    now = timezone.now()
    Rollout.objects.create(
        fleet=seeded_fleet, model="qwen-small", state="stepping", created_at=now, updated_at=now
    )
    Rollout.objects.create(
        fleet=seeded_fleet, model="qwen-small", state="rolled_back", created_at=now, updated_at=now
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Rollout.objects.create(
            fleet=seeded_fleet, model="llama-small", state="paused", created_at=now, updated_at=now
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        Rollout.objects.create(
            fleet=seeded_fleet, model="x", state="sideways", created_at=now, updated_at=now
        )


@pytest.mark.django_db
def test_a_move_from_a_stale_read_writes_nothing(seeded_fleet):
    rollout = rollout_create(fleet=seeded_fleet, body=BODY, actor="test")
    stale = Rollout.objects.get(pk=rollout.id)
    assert rollout_move(rollout, to_state="preparing", actor="a", event="preparing")
    before = Event.objects.count()
    assert not rollout_move(stale, to_state="preparing", actor="b", event="preparing")
    assert Event.objects.count() == before
    assert Rollout.objects.get(pk=rollout.id).version == 2


@pytest.mark.django_db
def test_no_rollout_beside_a_promotion_and_no_promotion_beside_a_rollout(seeded_fleet):
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id="west")
    with pytest.raises(RolloutConflict, match="operation"):
        rollout_create(fleet=seeded_fleet, body=BODY, actor="test")
    assert not Rollout.objects.exists()
    op.operation.__class__.objects.filter(pk=op.operation.id).update(state="succeeded")
    rollout = rollout_create(fleet=seeded_fleet, body=BODY, actor="test")
    assert rollout.state == "pending"


@pytest.mark.django_db
def test_a_pause_pins_and_is_recorded(seeded_fleet):
    rollout = rollout_create(fleet=seeded_fleet, body=BODY, actor="test")
    Rollout.objects.filter(pk=rollout.id).update(state="stepping")
    paused = rollout_pause(fleet_id=seeded_fleet.id, rollout_id=str(rollout.id), actor="ops")
    assert (paused.state, paused.pinned, paused.paused_from) == ("paused", True, "stepping")
    event = Event.objects.get(kind="rollout.paused")
    assert event.actor == "ops" and event.data["from"] == "stepping"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_create_exactly_one_rollout(seeded_fleet):
    count = 8
    barrier = threading.Barrier(count, timeout=30)

    def start(_i: int) -> str:
        try:
            barrier.wait()
            rollout_create(fleet=seeded_fleet, body=BODY, actor="race")
            return "created"
        except RolloutConflict:
            return "conflict"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(start, range(count)))
    assert results.count("created") == 1, results
    assert Rollout.objects.filter(fleet=seeded_fleet).count() == 1
    assert Event.objects.filter(kind="rollout.requested").count() == 1
