"""Rollout series in /metrics, read from the database (fleets/metrics/rollouts.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from fleets.models import Rollout

pytestmark = pytest.mark.django_db


def _samples(text: str, family: str) -> dict[str, float]:
    found = re.findall(rf"^{family}(\{{[^}}]*\}}) ([0-9.e+-]+)$", text, flags=re.M)
    return {labels: float(value) for labels, value in found}


def test_a_fleet_shows_its_newest_rollout_and_the_last_breach_to_weight_change(
    seeded_fleet, client
):
    now = timezone.now()
    # An older rollout rolled back on a gate's breach; the newest is stepping at 5 %.
    Rollout.objects.create(
        fleet=seeded_fleet,
        model="qwen-small",
        state="rolled_back",
        progress={"breachAt": now.isoformat(), "breachToWeightChangeMs": 240},
        created_at=now - timedelta(hours=1),
        updated_at=now,
    )
    Rollout.objects.create(
        fleet=seeded_fleet,
        model="qwen-small",
        state="stepping",
        step_index=1,
        weight_permille=50,
        created_at=now,
        updated_at=now,
    )

    text = client.get("/metrics").content.decode()

    assert _samples(text, "haru_rollout_state") == {
        '{fleet="demo",model="qwen-small",state="stepping"}': 1
    }
    labels = '{fleet="demo",model="qwen-small"}'
    assert _samples(text, "haru_rollout_weight_permille") == {labels: 50}
    assert _samples(text, "haru_rollout_step") == {labels: 2}
    assert _samples(text, "haru_rollout_breach_to_weight_change_seconds") == {labels: 0.24}


def test_a_fleet_without_a_rollout_has_no_rollout_series_but_they_are_declared(
    seeded_fleet, client
):
    text = client.get("/metrics").content.decode()
    assert "# TYPE haru_rollout_state gauge" in text
    assert _samples(text, "haru_rollout_state") == {}
    assert _samples(text, "haru_rollout_breach_to_weight_change_seconds") == {}
