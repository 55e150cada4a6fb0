"""A rollout's moves reach the fleet page's live group like an operation's steps: each is an
event, and every event is broadcast after its commit (the panel is re-fetched on each)."""

from __future__ import annotations

import pytest

from fleets.models import Rollout
from fleets.services import broadcast
from fleets.services.rollouts import rollout_abort, rollout_create, rollout_move
from tests.live.test_broadcast_publisher import _listen, _received

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {
    "model": "qwen-small",
    "candidate": {"kind": "same-weights", "profile": {"engine": "sim"}},
    "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
}


def test_a_rollouts_moves_are_broadcast_to_the_fleets_group(
    channel_layer, seeded_fleet, monkeypatch
):
    # As a Celery worker or the reconcile loop's thread: no ASGI server loop to hand sends to.
    monkeypatch.setattr(broadcast.publisher(), "server_loop", None)
    assert broadcast.flush(10)
    channel = _listen(channel_layer, seeded_fleet.id)
    rollout = rollout_create(fleet=seeded_fleet, body=BODY, actor="ops")
    assert rollout_move(
        Rollout.objects.get(pk=rollout.pk), to_state="preparing", actor="t", event="preparing"
    )
    rollout_abort(fleet_id=seeded_fleet.id, rollout_id=str(rollout.id), actor="ops")
    assert broadcast.flush(10)

    kinds = [m["event"]["kind"] for m in _received(channel_layer, channel)]
    assert kinds[:2] == ["rollout.requested", "rollout.preparing"]
    assert any(k.startswith("rollout.") for k in kinds[2:])  # the abort's move
