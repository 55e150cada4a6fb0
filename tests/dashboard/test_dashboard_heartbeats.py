"""The dashboard's heartbeat age is the API's lastSeenAt: polled every second, same column."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client

from fleets.base import clock
from fleets.models import Domain

pytestmark = pytest.mark.django_db

JS = Path(__file__).resolve().parents[2] / "haru" / "static" / "haru" / "dashboard.js"


@pytest.fixture
def staff_client(django_user_model):
    client = Client()
    client.force_login(
        django_user_model.objects.create_user(
            "ops", password="pw-ops-1234", is_staff=True, is_superuser=True
        )
    )
    return client


def test_the_poll_answers_the_apis_last_seen_at_and_staleness(
    staff_client, api_client, api_token, seeded_fleet, fake_clock
):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    Domain.objects.filter(pk=east.pk).update(
        last_seen_at=clock.now() - timedelta(milliseconds=1200)
    )
    Domain.objects.filter(pk=west.pk).update(last_seen_at=clock.now() - timedelta(seconds=40))
    body = staff_client.get("/live/heartbeats/?fleet=demo").json()
    api = api_client.get("/v1/fleets/demo", HTTP_AUTHORIZATION=f"Bearer {api_token}").json()
    api_seen = {d["id"]: d["lastSeenAt"] for d in api["domains"]}
    assert {k: v["lastSeenAt"] for k, v in body["domains"].items()} == api_seen
    assert body["domains"][str(east.id)]["stale"] is False
    assert body["domains"][str(west.id)]["stale"] is True  # demo policy: 3 s
    assert body["generatedAt"] == clock.iso(clock.now())
    # Unfiltered (the overview) carries the same.
    assert staff_client.get("/live/heartbeats/").json()["domains"] == body["domains"]


def test_the_poll_is_staff_only_and_refuses_an_unknown_fleet(client, staff_client, seeded_fleet):
    assert client.get("/live/heartbeats/").status_code == 302
    assert staff_client.get("/live/heartbeats/?fleet=nope").status_code == 404


def test_both_pages_poll_it_and_mark_every_age_by_domain(staff_client, seeded_fleet):
    ids = {str(d.id) for d in Domain.objects.filter(fleet=seeded_fleet)}
    for path in ("/fleets/demo/", "/"):
        page = staff_client.get(path).content.decode()
        assert 'data-heartbeats-url="/live/heartbeats/' in page
        assert set(re.findall(r'data-hb-domain="([^"]+)"', page)) == ids
    script = JS.read_text()
    # Polled every second (not with the 5 s fragment refresh) and applied to the ages.
    assert re.search(r"setInterval\(pollHeartbeats, HEARTBEATS_EVERY_MS\)", script)
    assert "HEARTBEATS_EVERY_MS = 1000" in script
    assert 'age.setAttribute("data-since", hb.lastSeenAt' in script
