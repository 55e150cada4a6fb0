"""Read routes: fleet list, snapshot, route intent, operations."""

from __future__ import annotations

import uuid

import pytest

from fleets.core.policy import DEFAULTS
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_cancel, operation_request, operation_start

pytestmark = pytest.mark.django_db


def test_fleet_list_shows_each_fleet_briefly(seeded_fleet, client_with_token):
    response = client_with_token.get("/v1/fleets")
    assert response.status_code == 200
    east = Domain.objects.get(slug="east")
    assert response.json() == {
        "fleets": [
            {
                "id": str(seeded_fleet.id),
                "slug": "demo",
                "displayName": "Demo fleet (two simulated hosts)",
                "activeDomainId": str(east.id),
                "routeRevision": 1,
            }
        ],
        "count": 1,
        "limit": 100,
        "offset": 0,
        "next": None,
        "previous": None,
    }


def test_fleet_list_is_empty_without_fleets(db, client_with_token):
    body = client_with_token.get("/v1/fleets").json()
    assert body["fleets"] == [] and body["count"] == 0 and body["next"] is None


def test_snapshot_has_resolved_policy_roles_slots_models_and_operation(
    seeded_fleet, client_with_token
):
    body = client_with_token.get("/v1/fleets/demo").json()
    east = Domain.objects.get(slug="east")
    assert body["id"] == str(seeded_fleet.id)
    assert (body["slug"], body["activeDomainId"], body["routeRevision"]) == (
        "demo",
        str(east.id),
        1,
    )
    # Operator-set keys win; the rest resolve from the defaults.
    assert body["policy"]["autoFailover"] is True
    assert body["policy"]["wakeTimeoutMs"] == 30000
    assert body["policy"]["switchActiveTimeoutMs"] == DEFAULTS["switchActiveTimeoutMs"]
    assert body["policy"]["probe"] == DEFAULTS["probe"]
    assert set(body["policy"]) == set(DEFAULTS)
    assert body["operation"] is None
    assert body["createdAt"].endswith("Z") and body["updatedAt"].endswith("Z")

    domains = {d["slug"]: d for d in body["domains"]}
    assert [d["slug"] for d in body["domains"]] == ["east", "west"]  # priority order
    assert (domains["east"]["role"], domains["west"]["role"]) == ("active", "standby")
    west = domains["west"]
    assert west["state"] == "ready"
    assert west["provider"] == "static"
    assert west["priority"] == 20
    assert west["supervisorUrl"] == "http://127.0.0.1:8702"
    assert west["servingBaseUrl"] == "http://127.0.0.1:18011"
    assert west["placement"]["region"] == "us-west-2"
    assert west["lastSeenAt"] is None
    inference, training = west["slots"]
    assert (inference["kind"], inference["gpuIndex"], inference["state"]) == (
        "inference",
        0,
        "sleeping",
    )
    assert inference["spec"] == {"sleepLevel": 1}
    assert sorted(m["name"] for m in inference["models"]) == ["llama-small", "qwen-small"]
    assert {m["servingUrl"] for m in inference["models"]} == {
        "http://127.0.0.1:18011",
        "http://127.0.0.1:18012",
    }
    assert (training["kind"], training["state"], training["pids"]) == ("training", "idle", [])
    assert training["spec"]["command"][:3] == ["python3", "-m", "supervisor.sim.trainer"]
    assert "models" not in training


def test_snapshot_shows_the_in_flight_operation(seeded_fleet, client_with_token):
    west = Domain.objects.get(slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    body = client_with_token.get("/v1/fleets/demo").json()
    assert body["operation"]["id"] == str(op.id)
    assert body["operation"]["state"] == "running"
    assert body["operation"]["currentStep"] == "stop_training"
    assert body["operation"]["targetDomainId"] == str(west.id)


def test_fleet_is_addressable_by_slug_and_by_uuid(seeded_fleet, client_with_token):
    by_slug = client_with_token.get("/v1/fleets/demo").json()
    by_id = client_with_token.get(f"/v1/fleets/{seeded_fleet.id}").json()
    by_upper_id = client_with_token.get(f"/v1/fleets/{str(seeded_fleet.id).upper()}").json()
    assert by_slug["id"] == by_id["id"] == by_upper_id["id"] == str(seeded_fleet.id)


def test_uuid_is_tried_before_slug(seeded_fleet, layout_data, client_with_token):
    # A second fleet whose slug is the first fleet's UUID string: the id must still win.
    impostor_slug = str(seeded_fleet.id)
    layout_apply(layout=parse_layout({**layout_data, "slug": impostor_slug}))
    impostor = Fleet.objects.get(slug=impostor_slug)
    assert client_with_token.get(f"/v1/fleets/{seeded_fleet.id}").json()["id"] == str(
        seeded_fleet.id
    )
    assert client_with_token.get(f"/v1/fleets/{impostor.id}").json()["id"] == str(impostor.id)


@pytest.mark.parametrize("ref", ["nope", str(uuid.UUID(int=7)), "DEMO-x"])
def test_unknown_fleet_is_a_404_envelope(seeded_fleet, client_with_token, envelope, ref):
    for suffix in ("", "/route-intent", "/operations"):
        envelope(client_with_token.get(f"/v1/fleets/{ref}{suffix}"), 404, "fleet_not_found")
    for action in ("promote", "demote"):
        response = client_with_token.post(
            f"/v1/fleets/{ref}/{action}", {"targetDomainId": "west"}, format="json"
        )
        envelope(response, 404, "fleet_not_found")


def test_route_intent_names_the_active_and_ranked_standbys(seeded_fleet, client_with_token):
    body = client_with_token.get("/v1/fleets/demo/route-intent").json()
    east, west = Domain.objects.get(slug="east"), Domain.objects.get(slug="west")
    assert set(body) == {
        "fleetId",
        "fleetSlug",
        "revision",
        "generatedAt",
        "active",
        "standbys",
        "failoverReadiness",
    }
    # Never heard from: the standby is not viable, and the verdict says so.
    readiness = body["failoverReadiness"]
    assert readiness["verdict"] == "not_ready" and readiness["standby"] == "west"
    assert readiness["reasons"][0]["message"] == "west has never answered a heartbeat"
    assert (body["fleetId"], body["fleetSlug"], body["revision"]) == (
        str(seeded_fleet.id),
        "demo",
        1,
    )
    assert body["generatedAt"].endswith("Z")
    active = body["active"]
    assert (active["domainId"], active["domainSlug"]) == (str(east.id), "east")
    assert (active["eligible"], active["weight"]) == (True, 1)
    assert active["endpointUrl"] == "http://127.0.0.1:18001"
    assert active["models"] == [
        {"name": "llama-small", "servingUrl": "http://127.0.0.1:18002", "eligible": True},
        {"name": "qwen-small", "servingUrl": "http://127.0.0.1:18001", "eligible": True},
    ]
    [standby] = body["standbys"]
    assert (standby["domainId"], standby["eligible"], standby["weight"]) == (str(west.id), False, 0)
    assert not any(m["eligible"] for m in standby["models"])


def test_route_intent_shows_a_split_and_reports_a_malformed_one(
    seeded_fleet, client_with_token, fake_clock
):
    east, west = Domain.objects.get(slug="east"), Domain.objects.get(slug="west")
    before = client_with_token.get("/v1/fleets/demo/route-intent").json()
    rollout = "8c1e0000-0000-4000-8000-000000000001"
    Fleet.objects.filter(pk=seeded_fleet.pk).update(
        route_splits={
            "qwen-small": {
                "rollout": rollout,
                "candidateDomain": str(west.id),
                "weightPermille": 250,
                "stickyHeader": "x-session-id",
            },
            "llama-small": {"rollout": rollout, "candidateDomain": 7, "weightPermille": 5},
        }
    )
    response = client_with_token.get("/v1/fleets/demo/route-intent")
    assert response.status_code == 200
    body = response.json()
    # Everything the unsplit document said, it still says.
    assert {k: body[k] for k in before} == before
    [split] = body["splits"]
    assert (split["model"], split["rolloutId"], split["stickyHeader"]) == (
        "qwen-small",
        rollout,
        "x-session-id",
    )
    stable, candidate = split["arms"]
    assert (stable["arm"], stable["domainId"], stable["weightPermille"], stable["weight"]) == (
        "stable",
        str(east.id),
        750,
        750,
    )
    assert (candidate["arm"], candidate["domainSlug"], candidate["weightPermille"]) == (
        "candidate",
        "west",
        250,
    )
    assert body["splitFaults"] == [
        {
            "model": "llama-small",
            "problem": "split of 'llama-small': candidateDomain must be a UUID",
        }
    ]


def test_route_intent_uses_the_injected_clock(seeded_fleet, client_with_token, fake_clock):
    body = client_with_token.get("/v1/fleets/demo/route-intent").json()
    assert body["generatedAt"] == "2026-01-01T00:00:00Z"


def test_route_intent_spells_its_own_and_its_readiness_timestamps_alike(
    seeded_fleet, client_with_token, fake_clock
):
    # Both are the same instant: one spelling (UTC, Z) for every timestamp in the body.
    fake_clock.advance(ms=250.5)
    body = client_with_token.get("/v1/fleets/demo/route-intent").json()
    assert body["generatedAt"] == "2026-01-01T00:00:00.250500Z"
    assert body["failoverReadiness"]["evaluatedAt"] == body["generatedAt"]


def test_fleet_operations_lists_newest_first(seeded_fleet, client_with_token, fake_clock):
    west = Domain.objects.get(slug="west")
    ids = []
    for _ in range(3):
        op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id)
        ids.append(str(op.operation.id))
        operation_cancel(operation_id=op.operation.id, actor="test")
        fake_clock.advance(seconds=1)
    body = client_with_token.get("/v1/fleets/demo/operations").json()
    assert [o["id"] for o in body["operations"]] == ids[::-1]
    assert body["operations"][0]["state"] == "cancelled"
    limited = client_with_token.get("/v1/fleets/demo/operations?limit=2").json()
    assert len(limited["operations"]) == 2
    sloppy = client_with_token.get("/v1/fleets/demo/operations?limit=lots").json()
    assert len(sloppy["operations"]) == 3


def test_operation_detail_renders_the_public_contract(seeded_fleet, client_with_token):
    east, west = Domain.objects.get(slug="east"), Domain.objects.get(slug="west")
    op = operation_request(
        fleet=seeded_fleet, kind="promote", target_domain_id=west.id, actor="api:alice"
    ).operation
    body = client_with_token.get(f"/v1/operations/{op.id}").json()
    assert body == {
        "id": str(op.id),
        "fleetId": str(seeded_fleet.id),
        "kind": "promote",
        "drillMode": None,
        "state": "pending",
        "targetDomainId": str(west.id),
        "targetDomainSlug": "west",
        "sourceDomainId": str(east.id),
        "currentStep": None,
        "stepStartedAt": None,
        "routingCommitted": False,
        "servedAt": None,
        "streamsContinued": None,
        "error": None,
        "cleanup": None,
        "reason": "manual",
        "requestedBy": "api:alice",
        "createdAt": body["createdAt"],
        "startedAt": None,
        "finishedAt": None,
    }
    assert body["createdAt"].endswith("Z")


@pytest.mark.parametrize("ref", [str(uuid.UUID(int=9)), "not-a-uuid"])
def test_unknown_operation_is_a_404_envelope(db, client_with_token, envelope, ref):
    envelope(client_with_token.get(f"/v1/operations/{ref}"), 404, "operation_not_found")
