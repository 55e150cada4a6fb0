"""The golden baselines routes: list them, and refuse a recording that cannot be trusted."""

from __future__ import annotations

import pytest

from fleets.core.golden import BaselineReason, GoldenKey
from fleets.models import Domain, Event, Fleet, GoldenBaseline
from fleets.services.baselines import NewBaseline, baseline_record

pytestmark = pytest.mark.django_db

URL = "/v1/fleets/demo/baselines"
KEY = GoldenKey("qwen-small", "qwen-sql", "p" * 32, "0.9.1", "r" * 32)


def test_listing_shows_each_baseline_with_its_key_and_answer(seeded_fleet, client_with_token):
    fleet = Fleet.objects.get(slug="demo")
    east = Domain.objects.get(fleet=fleet, slug="east")
    baseline_record(
        fleet_id=fleet.id,
        domain_id=east.id,
        baselines=[NewBaseline(KEY, "Hello with sql")],
        reason=BaselineReason.OPERATOR,
        actor="api:ops",
        replace=True,
    )
    body = client_with_token.get(URL).json()
    (only,) = body["baselines"]
    assert only["model"] == "qwen-small" and only["adapter"] == "qwen-sql"
    assert only["engineVersion"] == "0.9.1" and only["answer"] == "Hello with sql"
    assert only["domain"] == "east" and only["reason"] == "operator"
    assert only["recordedBy"] == "api:ops"


def test_re_recording_a_drift_replaces_it_and_the_event_names_what_it_replaced(seeded_fleet):
    fleet = Fleet.objects.get(slug="demo")

    def record(answer: str, *, replace: bool) -> list[str]:
        return baseline_record(
            fleet_id=fleet.id,
            domain_id=None,
            baselines=[NewBaseline(KEY, answer)],
            reason=BaselineReason.OPERATOR,
            actor="api:ops",
            replace=replace,
        )

    assert record("old words", replace=True) == ["qwen-small (adapter qwen-sql)"]
    assert record("new words", replace=False) == []  # a first serving never overwrites
    assert record("old words", replace=True) == []  # the same answer: nothing to record
    assert record("new words", replace=True) == ["qwen-small (adapter qwen-sql)"]
    assert GoldenBaseline.objects.get(fleet=fleet).answer == "new words"
    events = Event.objects.filter(fleet=fleet, kind="golden.baseline.recorded").order_by("id")
    assert [e.data["replacedSha256"] is None for e in events] == [True, False]


def test_recording_from_a_sleeping_standby_is_refused_with_nothing_recorded(
    seeded_fleet, client_with_token, envelope
):
    response = client_with_token.post(URL, {"domainId": "west"}, format="json")
    error = envelope(response, 422, "invalid_target")
    assert "west is not serving" in error["message"]
    assert not GoldenBaseline.objects.exists()


def test_an_unknown_field_is_refused(seeded_fleet, client_with_token, envelope):
    response = client_with_token.post(URL, {"domain": "west"}, format="json")
    envelope(response, 400, "invalid_request")
    assert not GoldenBaseline.objects.exists()


def test_a_key_recorded_meanwhile_by_another_process_is_left_alone(seeded_fleet, monkeypatch):
    fleet = Fleet.objects.get(slug="demo")
    record = {
        "fleet_id": fleet.id,
        "domain_id": None,
        "baselines": [NewBaseline(KEY, "mine")],
        "reason": BaselineReason.OPERATOR,
        "actor": "api:ops",
        "replace": False,
    }

    # The other process's row lands between our look-up and our insert.
    def racing_lookup():
        GoldenBaseline.objects.create(
            fleet=fleet,
            model_name=KEY.model,
            adapter=KEY.adapter,
            profile_fingerprint=KEY.profile_fingerprint,
            engine_version=KEY.engine_version,
            request_fingerprint=KEY.request_fingerprint,
            answer_sha256="0" * 64,
            answer="theirs",
            reason="first_serving",
            recorded_at=fleet.created_at,
        )
        return GoldenBaseline.objects.none()  # our look-up saw nothing

    monkeypatch.setattr(GoldenBaseline.objects, "select_for_update", racing_lookup)
    assert baseline_record(**record) == []
    monkeypatch.undo()
    assert GoldenBaseline.objects.get().answer == "theirs"
    assert not Event.objects.filter(kind="golden.baseline.recorded").exists()
