"""What drives ticks: the API, the management command, the kick on create, the loop, metrics."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from fleets import tasks
from fleets.models import Operation
from fleets.reconciler import kick
from fleets.reconciler import tick as tick_module
from fleets.reconciler.locks import fleet_tick_lock
from fleets.reconciler.loop import ReconcileLoop
from fleets.services.operations import operation_cancel, operation_request


@pytest.fixture
def authed(api_client, api_token):
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    return api_client


@pytest.mark.django_db
def test_reconcile_endpoint_runs_a_tick_and_returns_the_operation(fleet, authed, domains):
    empty = authed.post("/v1/fleets/demo/reconcile")
    assert empty.status_code == 200
    assert empty.json() == {
        "fleetId": str(fleet.id),
        "ran": True,
        "skipped": None,
        "operation": None,
    }

    op = operation_request(fleet=fleet, kind="promote", target_domain_id=domains()["west"].id)
    body = authed.post(f"/v1/fleets/{fleet.id}/reconcile").json()
    assert body["operation"]["id"] == str(op.operation.id)
    assert body["operation"]["state"] in ("running", "succeeded")


@pytest.mark.django_db
def test_reconcile_endpoint_says_it_skipped_when_the_tick_lock_is_busy(fleet, authed, monkeypatch):
    monkeypatch.setattr(tick_module, "RECONCILE_WAIT_S", 0.1)
    # Another holder's lease (each acquisition is its own holder, whatever thread takes it).
    with fleet_tick_lock(fleet.id, wait_s=0) as lease:
        assert lease
        busy = authed.post("/v1/fleets/demo/reconcile")
    assert busy.status_code == 200
    assert busy.json()["ran"] is False and busy.json()["skipped"] == "tick_lock_busy"


@pytest.mark.django_db
def test_reconcile_endpoint_needs_a_token_and_a_fleet(fleet, api_client, api_token, authed):
    assert APIClient().post("/v1/fleets/demo/reconcile").status_code == 401
    missing = authed.post("/v1/fleets/nope/reconcile")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "fleet_not_found"


@pytest.mark.django_db
def test_reconcile_command_prints_one_json_line_per_fleet(fleet, domains):
    operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    out = io.StringIO()
    call_command("reconcile", "--fleet", "demo", stdout=out)
    line = json.loads(out.getvalue().strip())
    assert line["fleetId"] == str(fleet.id) and line["ran"] is True
    assert line["operation"]["kind"] == "demote"


@pytest.mark.django_db
def test_a_created_operation_kicks_the_chosen_driver_after_commit(
    fleet, domains, django_capture_on_commit_callbacks
):
    kicked = []
    kick.drive(kick.TickDriver(lambda fleet_id, delay_ms: kicked.append((fleet_id, delay_ms))))
    with django_capture_on_commit_callbacks(execute=True):
        operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
        assert kicked == []  # not before commit
    assert kicked == [(str(fleet.id), 0)]


@pytest.mark.django_db
def test_a_cancelled_operation_kicks_the_chosen_driver_after_commit(
    fleet, domains, django_capture_on_commit_callbacks
):
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    kicked = []
    kick.drive(kick.TickDriver(lambda fleet_id, delay_ms: kicked.append((fleet_id, delay_ms))))
    with django_capture_on_commit_callbacks(execute=True):
        assert operation_cancel(operation_id=op.operation.id, actor="test")
        assert kicked == []  # not before commit
    assert kicked == [(str(fleet.id), 0)]


@pytest.mark.django_db
def test_without_a_driver_a_kick_does_nothing(
    fleet, domains, monkeypatch, django_capture_on_commit_callbacks
):
    ticked = []
    monkeypatch.setattr(ReconcileLoop, "request", lambda self, *args: ticked.append(args))
    for task in (tasks.reconcile_fleet, tasks.datapath_report):
        monkeypatch.setattr(task, "apply_async", lambda *args, **kw: ticked.append(args))
    kick.drive(None)
    with django_capture_on_commit_callbacks(execute=True) as sent:
        op = operation_request(fleet=fleet, kind="demote", target_domain_id=domains()["west"].id)
    assert sent  # the operation_created signal went out, to no driver
    kick.fleet_kick(str(fleet.id), delay_ms=5)
    kick.datapath_kick(str(fleet.id), str(domains()["east"].id), "m", 1.0)
    assert ticked == []
    assert Operation.objects.get(pk=op.operation.id).state == "pending"  # nothing ticked it


@pytest.mark.django_db
def test_metrics_expose_domain_state_role_revision_and_operations(fleet, tick, client):
    tick()
    text = client.get("/metrics").content.decode()
    assert 'haru_domain_state{domain="east",fleet="demo",state="ready"} 1.0' in text
    assert 'haru_domain_role{domain="west",fleet="demo",role="standby"} 1.0' in text
    assert 'haru_fleet_route_revision{fleet="demo"} 1.0' in text
    assert 'haru_domain_heartbeat_age_seconds{domain="east",fleet="demo"} 0.0' in text
    # Only the member a domain is in, and only the (kind, outcome) pairs with operations: the
    # zeros are absent (fleets/metrics/reconcile.py).
    assert 'haru_domain_state{domain="east",fleet="demo",state="degraded"}' not in text
    assert 'haru_domain_role{domain="west",fleet="demo",role="active"}' not in text
    assert 'haru_operations_total{fleet="demo",kind="promote",outcome="succeeded"}' not in text
    op = operation_request(
        fleet=fleet, kind="promote", target_domain_id=fleet.domains.get(slug="west").id
    )
    text = client.get("/metrics").content.decode()
    assert (
        f'haru_operations_total{{fleet="demo",kind="promote",outcome="{op.operation.state}"}} 1.0'
        in text
    )
    assert "haru_state_store_up 1.0" in text
    assert "haru_operation_step_duration_seconds" in text
    assert "haru_supervisor_call_errors_total" in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_in_process_loop_runs_a_kicked_promotion_to_the_end(fleet, domains, ticking_clock):
    finished = threading.Event()
    loop = ReconcileLoop(interval_ms=100, fleets=["demo"]).start()
    kick.drive(kick.TickDriver(loop.request))
    try:
        op = operation_request(
            fleet=fleet, kind="promote", target_domain_id=domains()["west"].id
        ).operation
        for _ in range(100):
            op.refresh_from_db()
            if op.state not in ("pending", "running"):
                finished.set()
                break
            finished.wait(0.1)
    finally:
        loop.stop()
    assert op.state == "succeeded", op.error
    assert Operation.objects.get(pk=op.pk).routing_committed
