"""Adapter freshness series in /metrics, read from the database (fleets/metrics/adapters.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from fleets.base import clock
from fleets.models import AdapterVersion, Fleet

pytestmark = pytest.mark.django_db


def _samples(text: str, family: str) -> dict[str, float]:
    found = re.findall(rf"^{family}(\{{[^}}]*\}}) ([0-9.e+-]+)$", text, flags=re.M)
    return {labels: float(value) for labels, value in found}


def _version(fleet, number: int, completed_h_ago: float, served_after_h: float | None):
    now = clock.now()
    done = now - timedelta(hours=completed_h_ago)
    AdapterVersion.objects.create(
        fleet=fleet,
        name="support-bot",
        version=number,
        base_model="qwen-small",
        digest=f"sha256:{number:064x}",
        size_bytes=1,
        manifest={},
        completed_at=done,
        registered_at=now,
        first_served_at=None if served_after_h is None else done + timedelta(hours=served_after_h),
    )


def test_the_age_of_what_users_get_and_checkpoint_to_first_token(seeded_fleet, client, fake_clock):
    _version(seeded_fleet, 1, completed_h_ago=30, served_after_h=2)
    _version(seeded_fleet, 2, completed_h_ago=6, served_after_h=0.5)  # a rollout's candidate
    _version(seeded_fleet, 3, completed_h_ago=1, served_after_h=None)  # not served yet
    route = {"base": "qwen-small", "version": 1, "candidate": 2, "weightPermille": 100}
    Fleet.objects.filter(pk=seeded_fleet.id).update(adapter_routes={"support-bot": route})

    text = client.get("/metrics").content.decode()

    labels = '{adapter="support-bot",fleet="demo"}'
    # Users are served v1 (the route's version), completed 30 h ago.
    assert _samples(text, "haru_adapter_served_age_seconds") == {labels: 30 * 3600}
    # The newest version a user got a token from is v2: half an hour after its completion.
    assert _samples(text, "haru_adapter_checkpoint_to_first_token_seconds") == {labels: 1800}


def test_a_fleet_without_adapter_routes_has_none_but_they_are_declared(seeded_fleet, client):
    text = client.get("/metrics").content.decode()
    assert "# TYPE haru_adapter_served_age_seconds gauge" in text
    assert _samples(text, "haru_adapter_served_age_seconds") == {}
