"""URLs with credentials: refused at input (layout loader, admin) with the path named and
nothing written; stripped on every output for rows stored before (API snapshot, route intent,
dashboard, layout export). Supervisor hosts outside HARU_SUPERVISOR_HOSTS are refused at apply."""

from __future__ import annotations

import pytest

from fleets.base import clock
from fleets.base.errors import LayoutError
from fleets.dashboard.selectors import fleet_page
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet, ModelBinding
from fleets.services.layouts import layout_apply, layout_export

pytestmark = pytest.mark.django_db

SECRET = "hunter2-secret"


def test_the_loader_refuses_credentials_in_every_url_naming_the_path(layout_data):
    east = layout_data["domains"][0]
    east["supervisorUrl"] = f"http://ops:{SECRET}@127.0.0.1:8701"
    east["servingBaseUrl"] = f"http://{SECRET}@127.0.0.1:18001"
    east["slots"][0]["models"][0]["servingUrl"] = f"https://u:{SECRET}@127.0.0.1:18002"
    with pytest.raises(LayoutError) as refused:
        parse_layout(layout_data)
    errors = refused.value.errors
    assert "domains[0].supervisorUrl: must not carry credentials" in "\n".join(errors)
    assert "domains[0].servingBaseUrl: must not carry credentials" in "\n".join(errors)
    assert "domains[0].slots[0].models[0].servingUrl: must not carry credentials" in "\n".join(
        errors
    )
    assert not any(SECRET in e for e in errors)
    assert not Fleet.objects.exists()


def test_apply_refuses_a_supervisor_host_outside_the_allow_list(layout_data, settings):
    settings.HARU = {**settings.HARU, "supervisor_hosts": ("10.0.0.0/8", "*.gpu.internal")}
    layout_data["domains"][0]["supervisorUrl"] = "https://east.gpu.internal:8701"
    layout_data["domains"][1]["supervisorUrl"] = "http://127.0.0.1:8702"
    layout = parse_layout(layout_data)
    with pytest.raises(LayoutError) as refused:
        layout_apply(layout=layout)
    assert refused.value.errors == [
        "domains[1].supervisorUrl: host '127.0.0.1' is not in HARU_SUPERVISOR_HOSTS "
        "(10.0.0.0/8, *.gpu.internal); a supervisor token is only sent to an allowed host"
    ]
    assert not Fleet.objects.exists()
    layout_data["domains"][1]["supervisorUrl"] = "https://10.1.2.3:8702"
    layout_apply(layout=parse_layout(layout_data))
    assert Domain.objects.count() == 2


@pytest.fixture
def stored_with_credentials(seeded_fleet):
    """Rows written before URLs with credentials were refused (straight to the database)."""
    Domain.objects.filter(slug="east").update(
        supervisor_url=f"http://ops:{SECRET}@127.0.0.1:8701",
        serving_base_url=f"http://{SECRET}@127.0.0.1:18001",
    )
    ModelBinding.objects.filter(domain__slug="east").update(
        serving_url=f"http://u:{SECRET}@127.0.0.1:18001"
    )
    return seeded_fleet


def test_the_api_snapshot_and_route_intent_strip_credentials(
    stored_with_credentials, api_client, api_token
):
    client_with_token = api_client
    client_with_token.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    snapshot = client_with_token.get("/v1/fleets/demo")
    intent = client_with_token.get("/v1/fleets/demo/route-intent")
    assert snapshot.status_code == intent.status_code == 200
    for body in (snapshot.content.decode(), intent.content.decode()):
        assert SECRET not in body and "ops:" not in body
    east = next(d for d in snapshot.json()["domains"] if d["slug"] == "east")
    assert east["supervisorUrl"] == "http://127.0.0.1:8701"
    assert east["servingBaseUrl"] == "http://127.0.0.1:18001"
    assert {m["servingUrl"] for s in east["slots"] for m in s.get("models", [])} == {
        "http://127.0.0.1:18001"
    }
    active = intent.json()["active"]
    assert active["endpointUrl"] == "http://127.0.0.1:18001"
    assert {m["servingUrl"] for m in active["models"]} == {"http://127.0.0.1:18001"}


def test_the_dashboard_and_the_export_strip_credentials(
    stored_with_credentials, client, django_user_model
):
    staff = django_user_model.objects.create_user(
        "ops", password="pw-123456", is_staff=True, is_superuser=True
    )
    client.force_login(staff)
    page = client.get("/fleets/demo/")
    assert page.status_code == 200 and SECRET not in page.content.decode()
    # What the page's templates are given, shown or not today.
    context = fleet_page(stored_with_credentials, now=clock.now())
    assert SECRET not in str(context)
    east = next(c for c in context["domains"] if c["slug"] == "east")
    assert east["supervisor_url"] == "http://127.0.0.1:8701"
    exported = str(layout_export(stored_with_credentials))
    assert SECRET not in exported and "http://127.0.0.1:8701" in exported


@pytest.mark.parametrize("suffix", ["?tenant=a", "/v1?x=1", "#frag", "?"])
def test_the_loader_refuses_a_query_or_fragment_in_every_url_naming_the_path(layout_data, suffix):
    east = layout_data["domains"][0]
    east["supervisorUrl"] = "http://127.0.0.1:8701" + suffix
    east["servingBaseUrl"] = "http://127.0.0.1:18001" + suffix
    east["slots"][0]["models"][0]["servingUrl"] = "http://127.0.0.1:18002" + suffix
    with pytest.raises(LayoutError) as refused:
        parse_layout(layout_data)
    rule = "must not carry a query (?...) or a fragment (#...); Haru appends paths to this URL"
    for where in (
        "domains[0].supervisorUrl",
        "domains[0].servingBaseUrl",
        "domains[0].slots[0].models[0].servingUrl",
    ):
        assert f"{where}: {rule}" in refused.value.errors
    assert not Fleet.objects.exists()
