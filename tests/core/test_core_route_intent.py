"""Route intent: who is eligible for traffic, in the public contract's shape."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fleets.core.policy import Policy
from fleets.core.read_model import DomainView, FleetView, ModelView
from fleets.core.route_intent import build_route_intent

NOW = datetime(2026, 1, 1, 0, 10, 0, 123456, tzinfo=UTC)


def model(name: str, slot_state: str = "serving", slug: str = "alpha") -> ModelView:
    return ModelView(name, f"http://{slug}:9000/{name}", f"{slug}-s0", 0, slot_state)


def domain(slug: str, state: str = "ready", *models: ModelView, **kw) -> DomainView:
    kw.setdefault("serving_base_url", f"http://{slug}:8000")
    kw.setdefault("last_seen_at", NOW - timedelta(seconds=1))
    return DomainView(id=f"id-{slug}", slug=slug, state=state, models=models, **kw)


def intent(*domains: DomainView, active: str | None = "id-alpha") -> dict:
    return build_route_intent(FleetView("f1", "prod", active, 4, Policy(), domains), NOW)


def test_document_has_the_contract_shape():
    doc = intent(domain("alpha", "ready", model("qwen")), domain("beta", "ready", model("qwen")))
    assert doc == {
        "fleetId": "f1",
        "fleetSlug": "prod",
        "revision": 4,
        "generatedAt": "2026-01-01T00:10:00.123456Z",
        "active": {
            "domainId": "id-alpha",
            "domainSlug": "alpha",
            "endpointUrl": "http://alpha:8000",
            "eligible": True,
            "weight": 1,
            "models": [{"name": "qwen", "servingUrl": "http://alpha:9000/qwen", "eligible": True}],
        },
        "standbys": [
            {
                "domainId": "id-beta",
                "domainSlug": "beta",
                "endpointUrl": "http://beta:8000",
                "eligible": False,
                "weight": 0,
                "models": [
                    {"name": "qwen", "servingUrl": "http://alpha:9000/qwen", "eligible": False}
                ],
            }
        ],
    }


def test_no_pointer_means_no_active_and_every_domain_as_standby():
    doc = intent(domain("alpha", "ready", model("qwen")), domain("beta"), active=None)
    assert doc["active"] is None
    assert [s["domainSlug"] for s in doc["standbys"]] == ["alpha", "beta"]


def test_degraded_active_keeps_its_serving_models_eligible():
    doc = intent(domain("alpha", "degraded", model("a"), model("b", "failed")))
    assert doc["active"]["eligible"] is True
    assert [m["eligible"] for m in doc["active"]["models"]] == [True, False]


@pytest.mark.parametrize("state", ["provisioning", "failed", "stopping", "stopped"])
def test_active_in_an_unroutable_state_is_not_eligible(state):
    doc = intent(domain("alpha", state, model("qwen")))
    assert doc["active"]["eligible"] is False
    assert doc["active"]["weight"] == 1
    assert doc["active"]["models"][0]["eligible"] is False


@pytest.mark.parametrize("slot_state", ["starting", "sleeping", "waking", "probing", "failed"])
def test_model_is_eligible_only_while_its_slot_serves(slot_state):
    doc = intent(domain("alpha", "ready", model("qwen", slot_state)))
    assert doc["active"]["models"][0]["eligible"] is False
    assert doc["active"]["eligible"] is False


def test_active_without_endpoint_url_is_not_eligible_but_its_models_are():
    doc = intent(domain("alpha", "ready", model("qwen"), serving_base_url=None))
    assert doc["active"]["endpointUrl"] is None
    assert doc["active"]["eligible"] is False
    assert doc["active"]["models"][0]["eligible"] is True


def test_active_without_models_is_not_eligible():
    doc = intent(domain("alpha", "ready"))
    assert doc["active"]["eligible"] is False
    assert doc["active"]["models"] == []


def test_standby_with_serving_slots_never_attracts_traffic():
    doc = intent(domain("alpha", "ready", model("qwen")), domain("beta", "ready", model("qwen")))
    beta = doc["standbys"][0]
    assert (beta["eligible"], beta["weight"]) == (False, 0)
    assert all(not m["eligible"] for m in beta["models"])


def test_standbys_follow_failover_rank_order():
    doc = intent(
        domain("alpha", "ready", model("q")),
        domain("zeta", "degraded"),
        domain("gamma", "ready", priority=2),
        domain("beta", "ready", priority=2, last_seen_at=None),
        domain("delta", "ready", priority=1),
    )
    assert [s["domainSlug"] for s in doc["standbys"]] == ["delta", "gamma", "beta", "zeta"]


def test_models_are_listed_by_name():
    doc = intent(domain("alpha", "ready", model("zeta"), model("alpha")))
    assert [m["name"] for m in doc["active"]["models"]] == ["alpha", "zeta"]


def _intent_at(generated_at: datetime) -> dict:
    return build_route_intent(FleetView("f1", "prod", None, 4, Policy(), ()), generated_at)


def test_generated_at_is_utc_with_z_even_from_another_zone():
    tokyo = datetime(2026, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=9)))
    assert _intent_at(tokyo)["generatedAt"] == "2026-01-01T00:00:00Z"


def test_naive_generated_at_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        _intent_at(datetime(2026, 1, 1))


def test_pointer_to_a_missing_domain_yields_no_active():
    doc = intent(domain("beta"), active="id-ghost")
    assert doc["active"] is None
    assert [s["domainSlug"] for s in doc["standbys"]] == ["beta"]
