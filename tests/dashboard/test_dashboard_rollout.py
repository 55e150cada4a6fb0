"""The fleet page's rollout panel: its arms against the gates, and pause, resume and abort
through the rollout services (operate role, CSRF, a confirmation first)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from fleets.base import clock
from fleets.core import latency_histogram as hist
from fleets.core.access import Role
from fleets.models import ArmSample, Rollout
from fleets.services.access import fleet_role_set
from fleets.services.rollouts import rollout_create, rollout_move

pytestmark = pytest.mark.django_db

PROFILE = {"engine": "sim", "modelPath": "/models/qwen-v2", "extraArgs": ["--ttft-ms", "40"]}
BODY = {
    "model": "qwen-small",
    "candidate": {"kind": "same-weights", "profile": PROFILE},
    "steps": [{"weight": 5, "dwellS": 30}, {"weight": 25, "dwellS": 30}, {"weight": 100}],
    "gates": {"minSamples": 10, "windowS": 60, "ttftP95Ratio": 1.5},
}


def _client(django_user_model, name: str, role: Role, fleet) -> Client:
    user = django_user_model.objects.create_user(name, password="pw-0123456789")
    fleet_role_set(holder=user, role=role, fleet=fleet)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(django_user_model, seeded_fleet) -> Client:
    return _client(django_user_model, "hands", Role.OPERATE, seeded_fleet)


@pytest.fixture
def viewer(django_user_model, seeded_fleet) -> Client:
    return _client(django_user_model, "watcher", Role.VIEW, seeded_fleet)


@pytest.fixture
def stepping(seeded_fleet) -> Rollout:
    """A rollout on its first step (5 %), with 20 requests on each arm in its window: the
    candidate twice as slow to first token."""
    rollout = rollout_create(fleet=seeded_fleet, body=BODY, actor="ops")
    now = clock.now()
    for state in ("preparing", "checking"):
        assert rollout_move(
            Rollout.objects.get(pk=rollout.pk), to_state=state, actor="test", event=state
        )
    assert rollout_move(
        Rollout.objects.get(pk=rollout.pk),
        to_state="stepping",
        actor="test",
        event="stepped",
        why="step 1 of 3: 5 % to the candidate",
        values={"step_index": 0, "weight_permille": 50, "step_started_at": now},
    )
    for arm, ms in (("stable", 40), ("candidate", 80)):
        ttft: dict[int, int] = {}
        for _ in range(20):
            hist.add(ttft, ms)
        ArmSample.objects.create(
            rollout_id=rollout.id,
            model="qwen-small",
            arm=arm,
            window_start=now + timedelta(seconds=1),
            requests=20,
            errors=1 if arm == "candidate" else 0,
            ttft=hist.sparse(ttft),
        )
    return Rollout.objects.get(pk=rollout.pk)


def test_the_panel_shows_the_arms_their_figures_and_the_gates_verdict(operator, stepping):
    html = operator.get("/fleets/demo/live/").content.decode()
    assert f'data-rollout-id="{stepping.id}"' in html
    assert 'data-rollout-state="stepping"' in html
    assert 'data-rollout-weight="5.0"' in html
    panel = html[html.index('data-rollout-id="') : html.index("readiness-panel")]
    # The candidate's version and both arms' figures, from the gates' own window.
    assert "/models/qwen-v2" in panel
    stable, candidate = re.findall(r"data-arm-requests>(\d+)<", panel)
    assert (stable, candidate) == ("20", "20")
    assert "5.0 %" in panel  # the candidate's error rate: 1 of 20
    assert 'data-rollout-verdict="fail"' in panel
    for action in ("rollout-pause", "rollout-abort"):
        assert f"/fleets/demo/actions/{action}/" in panel
    assert "/actions/rollout-resume/" not in panel


def test_a_viewer_sees_the_panel_without_buttons_and_is_refused_an_abort(viewer, stepping):
    html = viewer.get("/fleets/demo/live/").content.decode()
    assert f'data-rollout-id="{stepping.id}"' in html
    assert "/actions/rollout-" not in html
    refused = viewer.post(
        "/fleets/demo/actions/rollout-abort/", {"target": str(stepping.id), "confirm": "on"}
    )
    assert refused.status_code == 403
    assert Rollout.objects.get(pk=stepping.pk).state == "stepping"


def test_abort_asks_first_then_rolls_back_through_the_service(operator, stepping):
    page = operator.post("/fleets/demo/actions/rollout-abort/", {"target": str(stepping.id)})
    assert b"Confirm: rollout-abort" in page.content
    assert Rollout.objects.get(pk=stepping.pk).state == "stepping"

    done = operator.post(
        "/fleets/demo/actions/rollout-abort/",
        {"target": str(stepping.id), "confirm": "on"},
        follow=True,
    )
    rollout = Rollout.objects.get(pk=stepping.pk)
    assert rollout.state == "rolling_back" and rollout.abort_requested
    assert f"rollout {str(stepping.id)[:8]} of qwen-small aborted" in done.content.decode()


def test_pause_then_resume(operator, stepping):
    def act(action: str):
        return operator.post(
            f"/fleets/demo/actions/{action}/",
            {"target": str(stepping.id), "confirm": "on"},
            HTTP_ACCEPT="application/json",
        )

    assert act("rollout-pause").status_code == 200
    rollout = Rollout.objects.get(pk=stepping.pk)
    assert (rollout.state, rollout.pinned) == ("paused", True)
    html = operator.get("/fleets/demo/live/").content.decode()
    assert "/actions/rollout-resume/" in html and "/actions/rollout-pause/" not in html

    assert act("rollout-resume").status_code == 200
    assert Rollout.objects.get(pk=stepping.pk).state == "stepping"
    # A second resume: the service's 409, nothing changed.
    again = act("rollout-resume")
    assert again.status_code == 409 and again.json()["error"]["code"] == "rollout_conflict"


def test_an_abort_needs_a_csrf_token(django_user_model, seeded_fleet, stepping):
    user = django_user_model.objects.create_user("strict", password="pw-0123456789")
    fleet_role_set(holder=user, role=Role.OPERATE, fleet=seeded_fleet)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    refused = client.post(
        "/fleets/demo/actions/rollout-abort/", {"target": str(stepping.id), "confirm": "on"}
    )
    assert refused.status_code == 403
    assert Rollout.objects.get(pk=stepping.pk).state == "stepping"


def test_an_abort_without_a_rollout_named_is_a_400_with_nothing_changed(operator, stepping):
    response = operator.post(
        "/fleets/demo/actions/rollout-abort/", {"confirm": "on"}, HTTP_ACCEPT="application/json"
    )
    assert response.status_code == 400
    assert "name the rollout" in response.json()["error"]["message"]
    assert Rollout.objects.get(pk=stepping.pk).state == "stepping"


def test_promote_early_starts_the_promotion_through_the_service(operator, stepping):
    html = operator.get("/fleets/demo/live/").content.decode()
    assert "/actions/rollout-promote/" in html
    done = operator.post(
        "/fleets/demo/actions/rollout-promote/",
        {"target": str(stepping.id), "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert done.status_code == 200
    assert Rollout.objects.get(pk=stepping.pk).state == "promoting"
    # Past the answer checks only: a second time is the service's 409, nothing changed.
    again = operator.post(
        "/fleets/demo/actions/rollout-promote/",
        {"target": str(stepping.id), "confirm": "on"},
        HTTP_ACCEPT="application/json",
    )
    assert again.status_code == 409
    assert Rollout.objects.get(pk=stepping.pk).state == "promoting"
