"""The admin's rollouts: read-only list and detail, and the operator's actions behind a
confirmation page, through the same services as the API."""

from __future__ import annotations

from fleets.models import Event, Rollout
from fleets.services.rollouts import rollout_create

BODY = {
    "model": "qwen-small",
    "candidate": {"kind": "same-weights", "profile": {"engine": "sim"}},
    "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
}


def _stepping(fleet) -> Rollout:
    rollout = rollout_create(fleet=fleet, body=BODY, actor="test")
    Rollout.objects.filter(pk=rollout.pk).update(state="stepping", weight_permille=50)
    return Rollout.objects.get(pk=rollout.pk)


def _action(client, action: str, pks, confirm: bool):
    data = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    if confirm:
        data["confirm"] = "yes"
    return client.post("/admin/fleets/rollout/", data, follow=confirm)


def test_the_list_and_the_detail_show_a_rollout_read_only(superuser_client, seeded_fleet):
    rollout = _stepping(seeded_fleet)
    page = superuser_client.get("/admin/fleets/rollout/").content.decode()
    assert "qwen-small" in page and "5 %" in page
    for action in ("pause_rollouts", "resume_rollouts", "promote_rollouts", "abort_rollouts"):
        assert f'value="{action}"' in page
    detail = superuser_client.get(f"/admin/fleets/rollout/{rollout.pk}/change/")
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "ttftP95Ratio" in body and 'name="state"' not in body


def test_pause_confirms_then_pins_through_the_service(superuser_client, seeded_fleet):
    rollout = _stepping(seeded_fleet)
    page = _action(superuser_client, "pause_rollouts", [rollout.pk], confirm=False)
    assert page.status_code == 200 and b"Pause these rollouts?" in page.content
    assert Rollout.objects.get(pk=rollout.pk).state == "stepping"

    done = _action(superuser_client, "pause_rollouts", [rollout.pk], confirm=True)
    rollout.refresh_from_db()
    assert (rollout.state, rollout.pinned) == ("paused", True)
    assert "paused and pinned" in done.content.decode()
    assert Event.objects.get(kind="rollout.paused").actor == "admin:root"


def test_abort_rolls_back_and_a_refusal_is_reported(superuser_client, seeded_fleet):
    rollout = _stepping(seeded_fleet)
    _action(superuser_client, "abort_rollouts", [rollout.pk], confirm=True)
    rollout.refresh_from_db()
    assert (rollout.state, rollout.abort_requested) == ("rolling_back", True)
    refused = _action(superuser_client, "resume_rollouts", [rollout.pk], confirm=True)
    assert "only a paused rollout resumes" in refused.content.decode()
