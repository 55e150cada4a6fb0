"""The rollout routes: start, list, read, and the operator's actions, with every refusal in the
envelope and nothing changed by a refused request."""

from __future__ import annotations

import pytest

from fleets.core.access import TokenScope
from fleets.models import Domain, Event, Rollout
from fleets.services.access import api_token_create
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db

URL = "/v1/fleets/demo/rollouts"
PROFILE = {"engine": "sim", "extraArgs": ["--ttft-ms", "40"]}


def body(**over):
    out = {
        "model": "qwen-small",
        "candidate": {
            "kind": "new-weights",
            "profile": PROFILE,
            "checks": [{"prompt": "Say hello", "expect": "Hello"}],
        },
        "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
    }
    out.update(over)
    return out


def post(client, url, data=None):
    return client.post(url, data if data is not None else {}, format="json")


def test_starting_a_rollout_is_202_and_names_both_arms(seeded_fleet, client_with_token):
    response = post(client_with_token, URL, body(stickyHeader="x-session"))
    assert response.status_code == 202, response.json()
    out = response.json()
    assert out["state"] == "pending"
    assert out["model"] == "qwen-small"
    assert out["stableDomainId"] == str(Domain.objects.get(slug="east").id)
    assert out["candidateDomainId"] == str(Domain.objects.get(slug="west").id)
    assert out["stickyHeader"] == "x-session"
    assert out["weightPermille"] == 0
    assert out["startedBy"].startswith("api")
    assert Event.objects.filter(kind="rollout.requested").count() == 1
    listed = client_with_token.get(URL).json()["rollouts"]
    assert [r["id"] for r in listed] == [out["id"]]
    assert client_with_token.get(f"{URL}/{out['id']}").json()["id"] == out["id"]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        (
            {"steps": [{"weight": 50, "dwellS": 30}, {"weight": 10, "dwellS": 30}]},
            "steps[1].weight",
        ),
        ({"model": "nope"}, "model"),
        ({"candidate": {"kind": "new-weights", "profile": PROFILE}}, "candidate.checks"),
        ({"gates": {"ttftP95Ratio": "fast"}}, "gates.ttftP95Ratio"),
        ({"surprise": True}, "surprise"),
        # The split's own rule (fleets/core/route_split.py): a lower-case token, 1 to 64.
        ({"stickyHeader": "X-Session-Id"}, "stickyHeader"),
        ({"stickyHeader": "x session"}, "stickyHeader"),
        ({"stickyHeader": "x-session\n"}, "stickyHeader"),
        ({"stickyHeader": "x" * 65}, "stickyHeader"),
        ({"stickyHeader": 7}, "stickyHeader"),
        ({"stickyHeader": None}, "stickyHeader"),
    ],
)
def test_a_bad_request_is_400_naming_the_field_and_changes_nothing(
    seeded_fleet, client_with_token, over, field
):
    response = post(client_with_token, URL, body(**over))
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert field in error["message"]
    assert not Rollout.objects.exists()
    assert not Event.objects.filter(kind__startswith="rollout.").exists()


@pytest.mark.parametrize("header", ["x-session-id", "x" * 64, "x_tenant.v2"])
def test_a_sticky_header_the_split_accepts_is_accepted_and_stored(
    seeded_fleet, client_with_token, header
):
    from fleets.core.route_split import split_parse  # noqa: PLC0415

    response = post(client_with_token, URL, body(stickyHeader=header))
    assert response.status_code == 202, response.json()
    rollout = Rollout.objects.get()
    assert rollout.sticky_header == header
    # What the rollout stores is what its split will carry: the split's parser accepts it.
    split = {
        "rollout": str(rollout.id),
        "candidateDomain": str(rollout.candidate_domain_id),
        "weightPermille": 10,
        "stickyHeader": rollout.sticky_header,
    }
    assert split_parse(split).sticky_header == header


def test_without_a_sticky_header_the_rollout_sticks_by_api_key(seeded_fleet, client_with_token):
    out = post(client_with_token, URL, body()).json()
    assert out["stickyHeader"] == ""


def test_one_rollout_at_a_time_and_none_beside_an_operation(
    seeded_fleet, client_with_token, envelope
):
    assert post(client_with_token, URL, body()).status_code == 202
    envelope(post(client_with_token, URL, body()), 409, "rollout_conflict")
    assert Rollout.objects.count() == 1
    Rollout.objects.update(state="rolled_back")
    operation_request(fleet=seeded_fleet, kind="promote", target_domain_id="west")
    envelope(post(client_with_token, URL, body()), 409, "rollout_conflict")
    assert Rollout.objects.count() == 1


def test_a_promotion_is_refused_while_a_rollout_is_in_flight(
    seeded_fleet, client_with_token, envelope
):
    assert post(client_with_token, URL, body()).status_code == 202
    error = envelope(
        post(client_with_token, "/v1/fleets/demo/promote", {"targetDomainId": "west"}),
        409,
        "operation_conflict",
    )
    assert "rollout" in error["message"]


def test_a_fleet_without_a_standby_is_422(seeded_fleet, client_with_token, envelope):
    Domain.objects.filter(slug="west").update(state="failed")
    envelope(post(client_with_token, URL, body()), 422, "invalid_target")
    assert not Rollout.objects.exists()


def test_a_standby_whose_supervisor_cannot_swap_is_422(seeded_fleet, client_with_token, envelope):
    Domain.objects.filter(slug="west").update(
        last_report={"slots": [], "ready": True, "features": ["probe.golden"]}
    )
    error = envelope(post(client_with_token, URL, body()), 422, "invalid_target")
    assert "model.swap" in error["message"]


def test_the_operator_actions(seeded_fleet, client_with_token, envelope):
    rollout_id = post(client_with_token, URL, body()).json()["id"]
    base = f"{URL}/{rollout_id}"
    # Pending: nothing to pause yet, nothing to promote; an abort ends it at once.
    envelope(post(client_with_token, f"{base}/pause"), 409, "rollout_conflict")
    envelope(post(client_with_token, f"{base}/promote"), 409, "rollout_conflict")
    Rollout.objects.filter(pk=rollout_id).update(state="stepping", step_index=0)
    paused = post(client_with_token, f"{base}/pause").json()
    assert (paused["state"], paused["pinned"], paused["pausedFrom"]) == ("paused", True, "stepping")
    resumed = post(client_with_token, f"{base}/resume").json()
    assert (resumed["state"], resumed["pinned"]) == ("stepping", False)
    promoted = post(client_with_token, f"{base}/promote").json()
    assert promoted["state"] == "promoting"
    envelope(post(client_with_token, f"{base}/abort"), 409, "rollout_conflict")
    envelope(post(client_with_token, f"{base}/sideways"), 404, "not_found")
    kinds = list(
        Event.objects.filter(kind__startswith="rollout.")
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds == [
        "rollout.requested",
        "rollout.paused",
        "rollout.resumed",
        "rollout.promote_early",
    ]


def test_an_abort_rolls_back_and_a_finished_rollout_refuses_more(
    seeded_fleet, client_with_token, envelope
):
    rollout_id = post(client_with_token, URL, body()).json()["id"]
    base = f"{URL}/{rollout_id}"
    Rollout.objects.filter(pk=rollout_id).update(state="stepping")
    aborted = post(client_with_token, f"{base}/abort").json()
    assert (aborted["state"], aborted["abortRequested"]) == ("rolling_back", True)
    Rollout.objects.filter(pk=rollout_id).update(state="aborted")
    envelope(post(client_with_token, f"{base}/resume"), 409, "rollout_conflict")


def test_an_unknown_rollout_is_404(seeded_fleet, client_with_token, envelope):
    envelope(client_with_token.get(f"{URL}/not-a-uuid"), 404, "rollout_not_found")
    missing = "3f1c2a6e-0000-4000-8000-000000000000"
    envelope(post(client_with_token, f"{URL}/{missing}/abort"), 404, "rollout_not_found")


def test_a_read_token_reads_rollouts_but_cannot_start_one(seeded_fleet, api_client, api_token):
    token = api_token_create(name="reader", scope=TokenScope.READ, fleets=[seeded_fleet])[1]
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api_client.get(URL).status_code == 200
    assert post(api_client, URL, body()).status_code == 403
    assert not Rollout.objects.exists()


def test_once_the_promotion_is_asked_neither_pause_nor_abort_holds_it_back(
    seeded_fleet, client_with_token, envelope
):
    rollout_id = post(client_with_token, URL, body()).json()["id"]
    base = f"{URL}/{rollout_id}"
    Rollout.objects.filter(pk=rollout_id).update(
        state="promoting", progress={"promotionId": "3f1c2a6e-0000-4000-8000-000000000001"}
    )
    envelope(post(client_with_token, f"{base}/pause"), 409, "rollout_conflict")
    envelope(post(client_with_token, f"{base}/abort"), 409, "rollout_conflict")
    assert Rollout.objects.get(pk=rollout_id).state == "promoting"
