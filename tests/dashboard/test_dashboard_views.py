"""Dashboard pages and actions: login, staff-only, stable hooks, CSRF, the API's messages."""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from common.ports import free_port
from fleets.base import clock
from fleets.core.states import DRILL_STEPS, ROUND_TRIP_DRILL_STEPS
from fleets.models import Domain, Event, Fleet, Operation
from fleets.services.events import event_record
from fleets.services.operations import (
    operation_fail,
    operation_request,
    operation_start,
    operation_step_done,
)
from tests.drivers.managed_layout import seed_managed_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(
        "ops", password="pw-ops-1234", is_staff=True, is_superuser=True
    )


@pytest.fixture
def staff_client(staff):
    client = Client()
    client.force_login(staff)
    return client


def _west(fleet):
    return Domain.objects.get(fleet=fleet, slug="west")


@pytest.mark.parametrize("path", ["/", "/fleets/demo/", "/fleets/demo/live/", "/live/overview/"])
def test_anonymous_user_is_sent_to_the_login_page(client, seeded_fleet, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_login_page_logs_a_staff_user_in_and_lands_on_the_overview(client, staff, seeded_fleet):
    page = client.get("/login/")
    assert page.status_code == 200
    response = client.post(
        "/login/", {"username": "ops", "password": "pw-ops-1234", "next": "/"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/"
    assert b'data-fleet-slug="demo"' in response.content


def test_a_logged_in_user_who_is_not_staff_is_refused(client, django_user_model, seeded_fleet):
    user = django_user_model.objects.create_user("visitor", password="pw-visitor-1")
    client.force_login(user)
    response = client.get("/fleets/demo/")
    assert response.status_code == 403
    assert b"holds no role on any fleet" in response.content


def test_logout_is_a_post_and_ends_the_session(staff_client, seeded_fleet):
    response = staff_client.post("/logout/")
    assert response.status_code == 302
    assert staff_client.get("/").status_code == 302


def test_overview_shows_each_fleet_with_active_domain_and_revision(staff_client, seeded_fleet):
    response = staff_client.get("/")
    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-fleet-slug="demo"' in html
    assert 'data-route-revision="1"' in html
    assert "<strong>east</strong>" in html


def test_fleet_page_carries_the_stable_hooks(staff_client, seeded_fleet):
    html = staff_client.get("/fleets/demo/").content.decode()
    assert re.search(r'data-domain-slug="east"[^>]*data-role="active"', html)
    assert re.search(r'data-domain-slug="west"[^>]*data-role="standby"', html)
    assert 'data-route-revision="1"' in html
    assert "data-operation-step=" in html
    assert f'data-ws-path="/ws/fleets/{seeded_fleet.slug}/"' in html


def test_live_fragment_is_the_changing_part_only(staff_client, seeded_fleet):
    response = staff_client.get("/fleets/demo/live/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html
    assert 'class="live-root"' in html
    assert response["Cache-Control"].startswith("max-age=0")


def test_unknown_fleet_is_a_404_page(staff_client, seeded_fleet):
    response = staff_client.get("/fleets/nope/")
    assert response.status_code == 404
    assert b"No fleet" in response.content


def test_in_flight_operation_shows_its_current_step(staff_client, seeded_fleet):
    result = operation_request(
        fleet=seeded_fleet, kind="promote", target_domain_id=_west(seeded_fleet).id
    )
    operation_start(operation_id=result.operation.id)
    html = staff_client.get("/fleets/demo/").content.decode()
    assert 'data-operation-step="stop_training"' in html
    assert 'data-step="stop_training" data-step-status="running"' in html
    assert 'data-step="wake" data-step-status="pending"' in html


# ----------------------------------------------------------------------------------------------
# Actions
# ----------------------------------------------------------------------------------------------


def test_action_posts_need_a_csrf_token(staff, seeded_fleet):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    response = client.post("/fleets/demo/actions/promote/", {"target": "west", "confirm": "on"})
    assert response.status_code == 403
    assert not Operation.objects.exists()

    page = client.get("/fleets/demo/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]
    response = client.post(
        "/fleets/demo/actions/promote/",
        {"target": "west", "confirm": "on", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302
    assert Operation.objects.filter(kind="promote", target_domain__slug="west").count() == 1


def test_unconfirmed_action_asks_for_confirmation_and_changes_nothing(staff_client, seeded_fleet):
    response = staff_client.post("/fleets/demo/actions/promote/", {"target": "west"})
    assert response.status_code == 200
    assert b"Confirm: promote west" in response.content
    assert b'name="confirm" value="on"' in response.content
    assert not Operation.objects.exists()


def test_confirmed_promote_starts_an_operation_and_says_so(staff_client, seeded_fleet):
    response = staff_client.post(
        "/fleets/demo/actions/promote/", {"target": "west", "confirm": "on"}, follow=True
    )
    op = Operation.objects.get()
    assert (op.kind, op.target_domain.slug, op.requested_by) == ("promote", "west", "dashboard:ops")
    assert f"promotion of west started (operation {str(op.id)[:8]})" in response.content.decode()


def test_action_answers_json_to_the_page_script(staff_client, seeded_fleet):
    response = staff_client.post(
        "/fleets/demo/actions/promote/",
        {"target": "west", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "accepted"
    assert body["operationId"] == str(Operation.objects.get().id)


def test_conflict_shows_the_apis_message(staff_client, api_client, seeded_fleet):
    operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=_west(seeded_fleet).id)
    api = api_client.post("/v1/fleets/demo/demote", {"targetDomainId": "west"}, format="json")
    assert api.status_code == 409

    response = staff_client.post(
        "/fleets/demo/actions/demote/",
        {"target": "west", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "operation_conflict"
    assert response.json()["error"]["message"] == api.json()["error"]["message"]

    page = staff_client.post(
        "/fleets/demo/actions/demote/", {"target": "west", "confirm": "on"}, follow=True
    )
    assert api.json()["error"]["message"] in page.content.decode()


def test_demoting_the_active_is_refused_with_the_apis_message(staff_client, seeded_fleet):
    response = staff_client.post(
        "/fleets/demo/actions/demote/",
        {"target": "east", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 422
    assert "is the active domain" in response.json()["error"]["message"]
    assert not Operation.objects.exists()


def test_promoting_the_active_is_a_no_op(staff_client, seeded_fleet):
    response = staff_client.post(
        "/fleets/demo/actions/promote/",
        {"target": "east", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 200
    assert response.json()["message"] == "east is already active (route revision 1)"


def test_promote_without_a_target_is_refused(staff_client, seeded_fleet):
    response = staff_client.post(
        "/fleets/demo/actions/promote/", {"confirm": "on"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 400


def test_actions_are_post_only(staff_client, seeded_fleet):
    assert staff_client.get("/fleets/demo/actions/promote/").status_code == 405


def test_reconcile_now_runs_a_tick_like_the_api(staff_client, seeded_fleet):
    # Point both supervisors at a closed port: the tick's heartbeats fail fast and say so.
    Domain.objects.filter(fleet=seeded_fleet).update(
        supervisor_url=f"http://127.0.0.1:{free_port()}"
    )
    response = staff_client.post(
        "/fleets/demo/actions/reconcile/", {"confirm": "on"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 200
    assert response.json()["message"].startswith("demo: reconciled")
    failed = Event.objects.filter(fleet=seeded_fleet, kind="domain.heartbeat.failed")
    assert failed.count() == 2
    page = staff_client.get("/fleets/demo/").content.decode()
    assert "last heartbeat:" in page


def test_provision_and_stop_buttons_act_on_managed_domains(staff_client, db):
    seed_managed_fleet()
    page = staff_client.get("/fleets/prov/").content.decode()
    assert 'data-action="stop"' in page  # the managed standby
    response = staff_client.post(
        "/fleets/prov/actions/stop/", {"target": "west", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )  # fmt: skip
    assert response.status_code == 202, response.content
    assert Domain.objects.get(slug="west").state == "stopping"
    refused = staff_client.post(
        "/fleets/prov/actions/provision/", {"target": "east", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )  # fmt: skip
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "provision_refused"


def test_login_page_prints_the_createsuperuser_command_of_this_installation(client):

    page = client.get("/login/").content.decode()
    python = Path(sys.executable)
    expected = (
        str(python.relative_to(settings.BASE_DIR))
        if python.is_relative_to(settings.BASE_DIR)
        else "python"
    )
    assert f"<code>{expected} manage.py createsuperuser</code>" in page
    assert str(settings.BASE_DIR) not in page  # no absolute paths on a public page


def test_the_fleet_page_shows_a_check_the_policy_accepts_as_accepted(staff_client, seeded_fleet):
    Fleet.objects.filter(pk=seeded_fleet.pk).update(
        policy={"readiness": {"acceptMissing": ["drill"]}}
    )
    page = staff_client.get("/fleets/demo/live/").content.decode()
    # No drill yet, accepted: marked as such, with the policy key that accepts it.
    assert (
        '<li class="reason reason-accepted" data-reason="drill" data-reason-status="accepted">'
        in page
    )
    assert "accepted by the fleet's policy (readiness.acceptMissing)" in page
    # Acceptance never hides a failover that would fail: no viable standby stays not_ready.
    assert 'data-readiness="not_ready"' in page


def test_the_fleet_page_shows_the_verdict_and_a_failed_drill_in_red(staff_client, seeded_fleet):
    page = staff_client.get("/fleets/demo/").content.decode()
    # Never heard from: no viable standby, and the page says why.
    assert 'data-readiness="not_ready"' in page
    assert "west has never answered a heartbeat" in page
    assert 'data-drill-state="none"' in page

    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    drill = operation_request(fleet=seeded_fleet, kind="drill", target_domain_id=None).operation
    operation_start(operation_id=drill.id)
    operation_fail(
        operation_id=drill.id, step="probe", code="probe_mismatch", message="qwen: expected x"
    )
    page = staff_client.get("/fleets/demo/live/").content.decode()
    assert "drill-panel drill-failed" in page and 'data-drill-state="failed"' in page
    assert "the last drill failed: probe_mismatch: qwen: expected x" in page


def test_a_drill_from_the_dashboard_is_refused_with_the_apis_message_while_in_flight(
    staff_client, seeded_fleet
):
    operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=_west(seeded_fleet).id)
    response = staff_client.post(
        "/fleets/demo/actions/drill/", {"confirm": "on"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["message"].startswith(
        "no drill while an operation is in flight: promote of domain west"
    )
    assert not Operation.objects.filter(kind="drill").exists()


def test_recording_a_baseline_from_a_sleeping_standby_is_refused_on_the_page(
    staff_client, seeded_fleet
):
    response = staff_client.post(
        "/fleets/demo/actions/baseline/",
        {"target": "west", "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert response.status_code == 422
    assert "west is not serving" in response.json()["error"]["message"]


def _standbys_fresh(fleet) -> None:
    Domain.objects.filter(fleet=fleet).update(last_seen_at=clock.now())


def _set_policy(fleet, **keys) -> None:
    fleet.policy = {**fleet.policy, **keys}
    fleet.save(update_fields=["policy"])


def _drill(client, **data):
    return client.post(
        "/fleets/demo/actions/drill/", {"confirm": "on", **data}, HTTP_ACCEPT="application/json"
    )


def test_the_drill_runs_in_the_mode_chosen_beside_run_drill_and_the_last_drill_line_shows_it(
    staff_client, seeded_fleet
):
    _standbys_fresh(seeded_fleet)
    page = staff_client.get("/fleets/demo/live/").content.decode()
    assert re.search(r'<select name="mode"[^>]*data-keep="drill-mode"', page)
    assert '<option value="check"' in page and '<option value="round_trip"' in page

    response = _drill(staff_client, mode="round_trip")

    assert response.status_code == 202, response.content
    assert response.json()["message"].startswith("round_trip drill of west started")
    drill = Operation.objects.get(kind="drill")
    assert drill.drill_mode == "round_trip"
    page = staff_client.get("/fleets/demo/live/").content.decode()
    line = re.search(r"<span[^>]*data-drill-line>(.*?)</span>\s*<form", page, flags=re.S)
    assert line is not None
    assert 'data-drill-mode="round_trip"' in line.group(1)
    assert "west · " in line.group(1) and "manual_drill" in line.group(1)


def test_no_mode_is_a_check_drill_and_the_line_says_check(staff_client, seeded_fleet):
    _standbys_fresh(seeded_fleet)
    assert _drill(staff_client).status_code == 202
    assert Operation.objects.get(kind="drill").drill_mode == "check"
    page = staff_client.get("/fleets/demo/live/").content.decode()
    assert 'data-drill-mode="check"' in page


def test_a_round_trip_from_the_dashboard_is_refused_with_the_apis_message_while_failover_is_off(
    staff_client, seeded_fleet, api_client
):
    _set_policy(seeded_fleet, autoFailover=False)
    _standbys_fresh(seeded_fleet)
    page = staff_client.get("/fleets/demo/live/").content.decode()
    assert "round trip (needs autoFailover)" in page

    response = _drill(staff_client, mode="round_trip")

    api = api_client.post("/v1/fleets/demo/drill", {"mode": "round_trip"}, format="json")
    assert response.status_code == api.status_code == 422
    assert response.json()["error"] == api.json()["error"]
    assert response.json()["error"]["message"].startswith(
        "no round-trip drill while autoFailover is off"
    )
    assert not Operation.objects.filter(kind="drill").exists()
    # A check is still allowed: routing does not move.
    assert _drill(staff_client, mode="check").status_code == 202


def test_an_unknown_drill_mode_is_refused_with_the_services_message(staff_client, seeded_fleet):
    _standbys_fresh(seeded_fleet)
    response = _drill(staff_client, mode="sideways")
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("unknown drill mode 'sideways'")
    assert not Operation.objects.exists()


def test_the_confirmation_page_without_script_keeps_the_drills_mode(staff_client, seeded_fleet):
    page = staff_client.post("/fleets/demo/actions/drill/", {"mode": "round_trip"})
    text = page.content.decode()
    assert page.status_code == 200 and "Run a round-trip drill of" in text
    assert '<input type="hidden" name="mode" value="round_trip">' in text
    check = staff_client.post("/fleets/demo/actions/drill/", {}).content.decode()
    assert "Run a check drill of" in check and "Routing never moves" in check
    assert not Operation.objects.exists()


def _passed_drill(fleet, finished, steps_ms: dict[str, int]) -> None:
    op = Operation.objects.create(
        fleet=fleet,
        kind="drill",
        drill_mode="check",
        state="succeeded",
        target_domain=_west(fleet),
        target_domain_slug="west",
        created_at=finished,
        started_at=finished,
        finished_at=finished,
    )
    for step, ms in steps_ms.items():
        event_record(
            fleet_id=fleet.id, operation_id=op.id, kind="operation.step.done", step=step,
            duration_ms=ms,
        )  # fmt: skip


def _recovery_row(page: str, kind: str) -> str:
    row = re.search(rf'<tr data-recovery-kind="{kind}"[^>]*>(.*?)</tr>', page, flags=re.S)
    assert row is not None, f"no {kind} row"
    return row.group(0)


def test_the_recovery_panel_shows_p50_and_p95_and_marks_a_p95_over_the_objective(
    staff_client, seeded_fleet
):
    _set_policy(seeded_fleet, rtoMs=20_000)
    now = clock.now()
    # Check drills: stop_training, verify_gpu, wake, probe; totals 1 s, 2 s and 30 s.
    for i, wake in enumerate((700, 1700, 29_700)):
        _passed_drill(
            seeded_fleet,
            now - timedelta(minutes=10 - i),
            {"stop_training": 100, "verify_gpu": 100, "wake": wake, "probe": 100},
        )
    page = staff_client.get("/fleets/demo/live/").content.decode()
    drill = _recovery_row(page, "drill")
    cells = re.findall(r'<td class="mono"[^>]*>(.*?)</td>', drill, flags=re.S)
    assert cells == ["3", "2.0 s", "30.0 s ✗ over objective"]
    assert 'class="bad-text"' in drill
    failover = _recovery_row(page, "failover")
    assert re.findall(r'<td class="mono"[^>]*>(.*?)</td>', failover) == ["0", "—", "—"]
    assert "over objective" not in failover and "bad-text" not in failover
    assert "objective 20.0 s" in page

    # Under the objective: the same p95 is not marked.
    _set_policy(seeded_fleet, rtoMs=60_000)
    page = staff_client.get("/fleets/demo/live/").content.decode()
    drill = _recovery_row(page, "drill")
    assert "over objective" not in drill and "bad-text" not in drill
    assert re.findall(r'<td class="mono"[^>]*>(.*?)</td>', drill)[2] == "30.0 s"


@pytest.mark.parametrize(
    ("mode", "plan"),
    [("check", DRILL_STEPS), ("round_trip", ROUND_TRIP_DRILL_STEPS)],
)
def test_the_drill_panel_shows_a_box_for_every_step_of_the_plan(
    staff_client, seeded_fleet, mode, plan
):
    """The panel listed only `operation.step.done` events: 3 boxes where the operation had run
    6 steps. Each step of the plan has its box, with how it ended or that it is still to come."""
    Domain.objects.filter(fleet=seeded_fleet).update(last_seen_at=clock.now())
    drill = operation_request(
        fleet=seeded_fleet, kind="drill", target_domain_id=None, drill_mode=mode
    ).operation
    operation_start(operation_id=drill.id)
    operation_step_done(operation_id=drill.id, step=plan[0])
    operation_step_done(operation_id=drill.id, step=plan[1], outcome="skipped")
    operation_step_done(operation_id=drill.id, step=plan[2])

    page = staff_client.get("/fleets/demo/live/").content.decode()
    boxes = re.findall(r'data-drill-step="([a-z_]+)" data-step-status="([a-z]+)"', page)
    assert [name for name, _ in boxes] == list(plan)
    status = dict(boxes)
    assert (status[plan[0]], status[plan[1]], status[plan[2]]) == ("done", "warn", "done")
    assert status[plan[3]] == "running"
    assert {status[s] for s in plan[4:]} == {"pending"}
