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


# --- splits (a rollout's weighted split of one model, fleets/core/route_split.py) ----------

ROLLOUT = "8c1e0000-0000-4000-8000-000000000001"
BETA = "00000000-0000-4000-8000-0000000000be"


def split_fleet(splits, *, beta_state: str = "ready", beta_slot: str = "serving") -> dict:
    alpha = DomainView(
        id="00000000-0000-4000-8000-0000000000a1",
        slug="alpha",
        state="ready",
        models=(model("qwen"),),
        serving_base_url="http://alpha:8000",
        last_seen_at=NOW,
    )
    beta = DomainView(
        id=BETA,
        slug="beta",
        state=beta_state,
        models=(model("qwen", beta_slot, slug="beta"),),
        serving_base_url="http://beta:8000",
        last_seen_at=NOW,
    )
    fleet = FleetView("f1", "prod", alpha.id, 4, Policy(), (alpha, beta))
    return build_route_intent(fleet, NOW, splits)


def stored(weight: int = 50, header: str = "") -> dict:
    return {
        "qwen": {
            "rollout": ROLLOUT,
            "candidateDomain": BETA,
            "weightPermille": weight,
            "stickyHeader": header,
        }
    }


@pytest.mark.parametrize("splits", [None, {}])
def test_without_a_split_the_document_has_no_split_keys(splits):
    doc = split_fleet(splits)
    assert "splits" not in doc and "splitFaults" not in doc
    assert doc["active"]["weight"] == 1 and doc["standbys"][0]["weight"] == 0


def test_a_split_names_both_arms_with_their_weights_the_rollout_and_the_sticky_header():
    doc = split_fleet(stored(50, "x-session-id"))
    assert doc["splits"] == [
        {
            "model": "qwen",
            "rolloutId": ROLLOUT,
            "stickyHeader": "x-session-id",
            "arms": [
                {
                    "arm": "stable",
                    "domainId": "00000000-0000-4000-8000-0000000000a1",
                    "domainSlug": "alpha",
                    "servingUrl": "http://alpha:9000/qwen",
                    "eligible": True,
                    "weight": 950,
                    "weightPermille": 950,
                },
                {
                    "arm": "candidate",
                    "domainId": BETA,
                    "domainSlug": "beta",
                    "servingUrl": "http://beta:9000/qwen",
                    "eligible": True,
                    "weight": 50,
                    "weightPermille": 50,
                },
            ],
        }
    ]
    assert "splitFaults" not in doc
    # The per-domain targets keep their meaning: the active serves every unsplit model.
    assert doc["active"]["weight"] == 1


def test_no_sticky_header_means_the_api_key_and_reads_null():
    assert split_fleet(stored(10))["splits"][0]["stickyHeader"] is None


def test_a_candidate_that_cannot_serve_is_shown_not_eligible():
    arms = split_fleet(stored(500), beta_slot="sleeping")["splits"][0]["arms"]
    assert [a["eligible"] for a in arms] == [True, False]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("garbage", "route splits must be an object"),
        ({f"m{i}": {} for i in range(65)}, "at most 64 route splits"),
        (
            {"qwen": {"rollout": ROLLOUT, "candidateDomain": BETA, "weightPermille": 2000}},
            "weightPermille",
        ),
        (
            {"qwen": {"rollout": "nope", "candidateDomain": BETA, "weightPermille": 5}},
            "rollout must be a UUID",
        ),
        (
            {"qwen": {"rollout": ROLLOUT, "candidateDomain": BETA, "weightPermille": 5, "x": 1}},
            "unknown keys",
        ),
        (
            {
                "qwen": {
                    "rollout": ROLLOUT,
                    "candidateDomain": BETA,
                    "weightPermille": 5,
                    "stickyHeader": "Bad Header",
                }
            },
            "stickyHeader",
        ),
        (
            {"qwen": {"rollout": ROLLOUT, "candidateDomain": ROLLOUT, "weightPermille": 5}},
            "not a domain of the fleet",
        ),
        (
            {
                "qwen": {
                    "rollout": ROLLOUT,
                    "candidateDomain": "00000000-0000-4000-8000-0000000000a1",
                    "weightPermille": 5,
                }
            },
            "is the active domain",
        ),
    ],
)
def test_a_malformed_stored_split_is_reported_never_raised(raw, problem):
    doc = split_fleet(raw)
    assert doc["splits"] == []
    assert len(doc["splitFaults"]) == 1 and problem in doc["splitFaults"][0]["problem"]


def test_one_malformed_split_does_not_hide_the_good_ones():
    raw = {**stored(5), "other": {"rollout": ROLLOUT}}
    doc = split_fleet(raw)
    assert [s["model"] for s in doc["splits"]] == ["qwen"]
    assert [f["model"] for f in doc["splitFaults"]] == ["other"]
