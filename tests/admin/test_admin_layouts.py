"""Admin: layout validation on the right field, read-only state, actions, export round trip."""

from __future__ import annotations

import json

import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Event, Fleet, ModelBinding, Operation, Slot
from fleets.services.layouts import layout_apply
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


def _domain(fleet, slug):
    return Domain.objects.get(fleet=fleet, slug=slug)


def _change_url(obj) -> str:
    return f"/admin/fleets/{obj._meta.model_name}/{obj.pk}/change/"


def _get_form(client, admin_form, obj) -> dict:
    response = client.get(_change_url(obj))
    assert response.status_code == 200
    return admin_form(response.content.decode(), f"{obj._meta.model_name}_form")


def _binding_index(data: dict, binding: ModelBinding) -> int:
    return next(
        int(k.split("-")[1])
        for k, v in data.items()
        if k.startswith("bindings-") and k.endswith("-id") and v == str(binding.pk)
    )


def _inline_form(response, prefix: str, index: int):
    for inline in response.context["inline_admin_formsets"]:
        if inline.formset.prefix == prefix:
            return inline.formset.forms[index]
    raise AssertionError(f"no inline {prefix}")


# ----------------------------------------------------------------------------------------------
# The acceptance trio
# ----------------------------------------------------------------------------------------------


def test_upper_case_model_name_is_a_field_error(superuser_client, admin_form, seeded_fleet):
    east = _domain(seeded_fleet, "east")
    binding = ModelBinding.objects.get(domain=east, name="qwen-small")
    data = _get_form(superuser_client, admin_form, east)
    i = _binding_index(data, binding)
    data[f"bindings-{i}-name"] = "Qwen-Small"

    response = superuser_client.post(_change_url(east), data)

    assert response.status_code == 200  # the form comes back with errors
    errors = _inline_form(response, "bindings", i).errors
    assert list(errors) == ["name"]
    assert "must be lowercase" in errors["name"][0]
    binding.refresh_from_db()
    assert binding.name == "qwen-small"


def test_policy_change_shows_in_the_api_snapshot(
    superuser_client, admin_form, api_client, seeded_fleet
):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    policy = json.loads(data["policy"])
    assert policy["wakeTimeoutMs"] == 30000
    policy["wakeTimeoutMs"] = 45000
    data["policy"] = json.dumps(policy)

    response = superuser_client.post(_change_url(seeded_fleet), data)

    assert response.status_code == 302, response.context and response.context["errors"]
    snapshot = api_client.get("/v1/fleets/demo").json()
    assert snapshot["policy"]["wakeTimeoutMs"] == 45000
    assert Event.objects.filter(kind="layout.edited", actor="admin:root").exists()


def test_export_round_trips_the_seeded_layout(superuser_client, layout_data, seeded_fleet):
    response = superuser_client.get(f"/admin/fleets/fleet/{seeded_fleet.pk}/export/")
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="demo.layout.json"'
    exported = json.loads(response.content)
    assert exported == layout_data

    # seed_layout accepts it unchanged: applying it to a fresh database gives the same export.
    # (The pointer protects the active domain from deletion; drop it to empty the database.)
    Fleet.objects.update(active_domain=None)
    Fleet.objects.all().delete()
    layout_apply(layout=parse_layout(exported))
    fleet = Fleet.objects.get(slug="demo")
    again = superuser_client.get(f"/admin/fleets/fleet/{fleet.pk}/export/")
    assert json.loads(again.content) == layout_data


# ----------------------------------------------------------------------------------------------
# More validation, each on its field
# ----------------------------------------------------------------------------------------------


def test_invalid_policy_value_is_an_error_on_the_policy_field(
    superuser_client, admin_form, seeded_fleet
):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    data["policy"] = json.dumps({"wakeTimeoutMs": 0, "autoFailver": True})
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["policy"]
    assert "autoFailver: unknown field" in errors["policy"][0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"autoFailover": true, "autoFailover": false}', "autoFailover: duplicate key"),
        ("[" * 100_000, "nested deeper than"),
    ],
    ids=["repeated-key", "nested-100000-deep"],
)
def test_hostile_json_in_an_admin_field_is_an_error_on_that_field(
    superuser_client, admin_form, seeded_fleet, text, message
):
    before = Fleet.objects.get(pk=seeded_fleet.pk).policy
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    data["policy"] = text
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["policy"]
    assert message in errors["policy"][0]
    assert Fleet.objects.get(pk=seeded_fleet.pk).policy == before  # nothing saved


def test_fleet_slug_pattern_is_enforced(superuser_client, admin_form, seeded_fleet):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    data["slug"] = "Demo_Fleet"
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    assert "lowercase letters and digits" in response.context["adminform"].form.errors["slug"][0]


def test_duplicate_model_name_in_a_domain_is_an_error_on_the_name(
    superuser_client, admin_form, seeded_fleet
):
    east = _domain(seeded_fleet, "east")
    llama = ModelBinding.objects.get(domain=east, name="llama-small")
    data = _get_form(superuser_client, admin_form, east)
    i = _binding_index(data, llama)
    data[f"bindings-{i}-name"] = "qwen-small"
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    forms = [_inline_form(response, "bindings", n) for n in range(2)]
    messages = [e for f in forms for e in f.errors.get("name", [])]
    assert any("duplicate model 'qwen-small'" in m for m in messages)


def test_gpu_index_rules_are_errors_on_the_gpu_index(superuser_client, admin_form, seeded_fleet):
    east = _domain(seeded_fleet, "east")
    data = _get_form(superuser_client, admin_form, east)
    total = int(data["slots-TOTAL_FORMS"])
    training = next(n for n in range(total) if data[f"slots-{n}-kind"] == "training")
    data[f"slots-{training}-gpu_index"] = "-1"
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    assert "gpu_index" in _inline_form(response, "slots", training).errors

    # A second training slot on GPU 0 collides with the first.
    data = _get_form(superuser_client, admin_form, east)
    data["slots-TOTAL_FORMS"] = str(total + 1)
    data.update(
        {
            f"slots-{total}-gpu_index": "0",
            f"slots-{total}-kind": "training",
            f"slots-{total}-command": "python\n-m\nsupervisor.sim.trainer",
            f"slots-{total}-checkpoint_dir": "var/ckpt",
        }
    )
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    errors = _inline_form(response, "slots", total).errors
    assert "a training slot on GPU 0 already exists" in errors["gpu_index"][0]


def test_training_slot_needs_a_command(superuser_client, admin_form, layout_data, seeded_fleet):
    east = _domain(seeded_fleet, "east")
    data = _get_form(superuser_client, admin_form, east)
    training = next(
        n for n in range(int(data["slots-TOTAL_FORMS"])) if data[f"slots-{n}-kind"] == "training"
    )
    command = next(s for s in layout_data["domains"][0]["slots"] if s["kind"] == "training")
    assert data[f"slots-{training}-command"] == "\n".join(command["command"])
    data[f"slots-{training}-command"] = "  \n"
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    assert list(_inline_form(response, "slots", training).errors) == ["command"]


def test_domain_placement_is_checked_against_the_layout_schema(
    superuser_client, admin_form, seeded_fleet
):
    east = _domain(seeded_fleet, "east")
    data = _get_form(superuser_client, admin_form, east)
    data["placement"] = json.dumps({"cloud": "aws", "acceleratorCount": 0})
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["placement"]


def test_a_placement_error_is_worded_like_the_layout_loader_words_it(
    superuser_client, admin_form, seeded_fleet
):
    east = _domain(seeded_fleet, "east")
    data = _get_form(superuser_client, admin_form, east)
    data["placement"] = json.dumps({"cloud": 3, "acceleratorCount": 2.0})
    response = superuser_client.post(_change_url(east), data)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["placement"] == [
        "placement.cloud: must be of type string",
        "placement.acceleratorCount: must be of type integer",  # a whole float is not one
    ]


# ----------------------------------------------------------------------------------------------
# State is read-only; new rows get their initial state
# ----------------------------------------------------------------------------------------------


def test_pointer_revision_and_state_fields_cannot_be_edited(
    superuser_client, admin_form, seeded_fleet
):
    html = superuser_client.get(_change_url(seeded_fleet)).content.decode()
    data = admin_form(html, "fleet_form")
    assert not {"active_domain", "route_revision"} & set(data)
    assert not any(k.endswith("-state") or k.endswith("-last_seen_at") for k in data)
    west = _domain(seeded_fleet, "west")
    data.update(
        {"active_domain": str(west.pk), "route_revision": "99", "domains-0-state": "failed"}
    )
    assert superuser_client.post(_change_url(seeded_fleet), data).status_code == 302
    seeded_fleet.refresh_from_db()
    assert (seeded_fleet.active_domain.slug, seeded_fleet.route_revision) == ("east", 1)
    assert set(Domain.objects.values_list("state", flat=True)) == {"ready"}

    east = _domain(seeded_fleet, "east")
    slot_data = _get_form(superuser_client, admin_form, east)
    assert not any(k.endswith("-state") or k.endswith("-pids") for k in slot_data)


def test_domain_added_inline_starts_in_its_initial_state(
    superuser_client, admin_form, seeded_fleet
):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    n = int(data["domains-TOTAL_FORMS"])
    data["domains-TOTAL_FORMS"] = str(n + 1)
    data.update(
        {
            f"domains-{n}-slug": "south",
            f"domains-{n}-provider": "skypilot",
            f"domains-{n}-priority": "30",
            f"domains-{n}-placement": "{}",
        }
    )
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 302
    south = _domain(seeded_fleet, "south")
    assert south.state == "provisioning"
    assert south.state_updated_at is not None


def test_the_active_domain_cannot_be_deleted_inline(superuser_client, admin_form, seeded_fleet):
    data = _get_form(superuser_client, admin_form, seeded_fleet)
    east = _domain(seeded_fleet, "east")
    i = next(
        int(k.split("-")[1])
        for k, v in data.items()
        if k.startswith("domains-") and k.endswith("-id") and v == str(east.pk)
    )
    data[f"domains-{i}-DELETE"] = "on"
    response = superuser_client.post(_change_url(seeded_fleet), data)
    assert response.status_code == 200
    assert "is the active domain" in response.content.decode()
    assert Domain.objects.filter(pk=east.pk).exists()


def test_slot_added_to_a_standby_starts_sleeping(superuser_client, admin_form, seeded_fleet):
    west = _domain(seeded_fleet, "west")
    data = _get_form(superuser_client, admin_form, west)
    n = int(data["slots-TOTAL_FORMS"])
    data["slots-TOTAL_FORMS"] = str(n + 1)
    data.update({f"slots-{n}-gpu_index": "1", f"slots-{n}-kind": "inference"})
    response = superuser_client.post(_change_url(west), data)
    assert response.status_code == 302
    slot = Slot.objects.get(domain=west, gpu_index=1)
    assert (slot.state, slot.spec) == ("sleeping", {"sleepLevel": 1})


# ----------------------------------------------------------------------------------------------
# Actions and the read-only audit
# ----------------------------------------------------------------------------------------------


def _action(client, model: str, action: str, pks, confirm: bool):
    data = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    if confirm:
        data["confirm"] = "yes"
    return client.post(f"/admin/fleets/{model}/", data, follow=confirm)


def test_promote_action_confirms_then_calls_the_service(superuser_client, seeded_fleet):
    west = _domain(seeded_fleet, "west")
    page = _action(superuser_client, "domain", "promote_domain", [west.pk], confirm=False)
    assert page.status_code == 200
    assert b"Yes, I&#x27;m sure" in page.content or b"Yes, I'm sure" in page.content
    assert not Operation.objects.exists()

    done = _action(superuser_client, "domain", "promote_domain", [west.pk], confirm=True)
    op = Operation.objects.get()
    assert (op.kind, op.target_domain_id, op.requested_by) == ("promote", west.pk, "admin:root")
    assert "promotion of west started" in done.content.decode()


@pytest.mark.parametrize("confirm", [False, True])
def test_promote_action_refuses_both_domains_of_one_fleet(superuser_client, seeded_fleet, confirm):
    data = {
        "action": "promote_domain",
        "_selected_action": [str(d.pk) for d in Domain.objects.filter(fleet=seeded_fleet)],
    }
    if confirm:
        data["confirm"] = "yes"
    response = superuser_client.post("/admin/fleets/domain/", data, follow=True)
    assert "Select one domain per fleet to promote; nothing done (demo)" in (
        response.content.decode()
    )
    assert not Operation.objects.exists()


def test_demote_action_reports_a_conflict_with_the_apis_message(superuser_client, seeded_fleet):
    west = _domain(seeded_fleet, "west")
    operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.pk)
    done = _action(superuser_client, "domain", "demote_domain", [west.pk], confirm=True)
    assert "is already in flight" in done.content.decode()
    assert Operation.objects.count() == 1


def test_operations_and_events_are_read_only_and_filterable(superuser_client, seeded_fleet):
    west = _domain(seeded_fleet, "west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.pk).operation
    for url in (
        f"/admin/fleets/operation/?fleet__id__exact={seeded_fleet.pk}&kind__exact=promote"
        "&state__exact=pending",
        f"/admin/fleets/operation/?q={str(op.id)[:8]}",
        "/admin/fleets/event/?kind=operation.requested.promote",
        "/admin/fleets/event/?q=layout",
        "/admin/fleets/event/?created_at__gte=2000-01-01",
    ):
        response = superuser_client.get(url)
        assert response.status_code == 200, url
    listing = superuser_client.get(f"/admin/fleets/operation/?q={str(op.id)[:8]}")
    assert str(op.id)[:8] in listing.content.decode()
    assert superuser_client.get("/admin/fleets/operation/add/").status_code == 403
    view = superuser_client.get(f"/admin/fleets/operation/{op.pk}/change/")
    assert view.status_code == 200
    assert b'name="state"' not in view.content
    event = Event.objects.first()
    assert superuser_client.post(f"/admin/fleets/event/{event.pk}/delete/").status_code == 403


# ----------------------------------------------------------------------------------------------
# A rollout in flight holds the layout (docs/rollouts.md, "Layouts and rollouts")
# ----------------------------------------------------------------------------------------------


def _start_rollout(fleet):
    from fleets.services.rollouts import rollout_create  # noqa: PLC0415

    return rollout_create(
        fleet=fleet,
        body={
            "model": "qwen-small",
            "candidate": {"kind": "same-weights", "profile": {"engine": "sim"}},
            "steps": [{"weight": 5, "dwellS": 30}, {"weight": 100}],
        },
        actor="test",
    )


def _all_errors(response) -> list[str]:
    found = [str(e) for e in response.context["adminform"].form.non_field_errors()]
    for inline in response.context["inline_admin_formsets"]:
        for form in inline.formset.forms:
            found += [str(e) for e in form.non_field_errors()]
    return found


def test_a_model_edit_is_refused_while_a_rollout_is_in_flight(
    superuser_client, admin_form, seeded_fleet
):
    west = _domain(seeded_fleet, "west")
    binding = ModelBinding.objects.get(domain=west, name="qwen-small")
    data = _get_form(superuser_client, admin_form, west)
    rollout = _start_rollout(seeded_fleet)
    i = _binding_index(data, binding)
    data[f"bindings-{i}-serving_url"] = "http://127.0.0.1:18099"
    response = superuser_client.post(_change_url(west), data)
    assert response.status_code == 200
    assert any(f"rollout {rollout.id}" in e and "in flight" in e for e in _all_errors(response))
    binding.refresh_from_db()
    assert binding.serving_url == "http://127.0.0.1:18011"


@pytest.mark.parametrize("what", ["domain", "slot"])
def test_domain_and_slot_edits_are_refused_while_a_rollout_is_in_flight(
    superuser_client, admin_form, seeded_fleet, what
):
    west = _domain(seeded_fleet, "west")
    data = _get_form(superuser_client, admin_form, west)
    _start_rollout(seeded_fleet)
    if what == "domain":
        data["priority"] = "5"
    else:
        n = int(data["slots-TOTAL_FORMS"])
        data["slots-TOTAL_FORMS"] = str(n + 1)
        data.update({f"slots-{n}-gpu_index": "1", f"slots-{n}-kind": "inference"})
    response = superuser_client.post(_change_url(west), data)
    assert response.status_code == 200
    assert any("is in flight" in e for e in _all_errors(response))
    west.refresh_from_db()
    assert west.priority == 20 and not Slot.objects.filter(domain=west, gpu_index=1).exists()


def test_an_unchanged_save_passes_during_a_rollout(superuser_client, admin_form, seeded_fleet):
    west = _domain(seeded_fleet, "west")
    data = _get_form(superuser_client, admin_form, west)
    _start_rollout(seeded_fleet)
    assert superuser_client.post(_change_url(west), data).status_code == 302
