"""No admin form can write a field the compare-and-swap services own."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import RequestFactory

from fleets.models import Domain, Fleet, ModelBinding, Operation, Slot
from fleets.services.operations import operation_request, operation_start

# Per model, the fields only the services move (fleets/models.py); every Operation field is one.
OWNED = {
    Operation: {f.name for f in Operation._meta.fields},
    Fleet: {"active_domain", "route_revision", "no_standby_reported_at", "baseline_probe_at"},
    Domain: {
        "state",
        "state_updated_at",
        "last_seen_at",
        "heartbeat_checked_at",
        "heartbeat_failing_since",
        "gpus_read_at",
        "last_report",
        "driver_status",
        "provision_attempt",
    },
    Slot: {"state", "state_updated_at", "pids"},
    ModelBinding: {"health", "health_at", "serving_seen_at", "engine_version", "engine_version_at"},
}
# The state fields of an operation as the services left them, and values an edit would try.
OPERATION_STATE = (
    "state",
    "current_step",
    "routing_committed",
    "error",
    "started_at",
    "finished_at",
)


@pytest.fixture
def superuser_request(django_user_model):
    request = RequestFactory().get("/admin/")
    request.user = django_user_model.objects.create_superuser("root", "r@example.com", "pw-123")
    return request


@pytest.fixture
def running_operation(seeded_fleet) -> Operation:
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    op = operation_request(fleet=seeded_fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    return Operation.objects.get(pk=op.pk)


def _instance(model, fleet, operation):
    return {
        Operation: operation,
        Fleet: fleet,
        Domain: Domain.objects.filter(fleet=fleet).first(),
        Slot: Slot.objects.filter(domain__fleet=fleet).first(),
        ModelBinding: ModelBinding.objects.filter(domain__fleet=fleet).first(),
    }.get(model)


def _writable(model_admin, request, obj) -> dict[type, set[str]]:
    """Per model, the fields the admin's forms (its own and its inlines') have inputs for."""
    found: dict[type, set[str]] = {}
    for o in (None, obj):
        change = o is not None
        if (change and not model_admin.has_view_or_change_permission(request, o)) or (
            not change and not model_admin.has_add_permission(request)
        ):
            continue
        # As the change view builds it: the fields shown, less those read-only.
        fields = admin.utils.flatten_fieldsets(model_admin.get_fieldsets(request, o))
        excluded = model_admin.get_readonly_fields(request, o)
        form = model_admin.get_form(request, o, change=change, fields=fields)
        found.setdefault(model_admin.model, set()).update(
            name for name in form.base_fields if name not in excluded
        )
        for formset, inline in model_admin.get_formsets_with_inlines(request, o):
            found.setdefault(inline.model, set()).update(formset.form.base_fields)
    return found


def test_no_admin_form_has_an_input_for_a_field_the_services_own(
    superuser_request, seeded_fleet, running_operation
):
    checked = set()
    for model, model_admin in admin.site._registry.items():
        obj = _instance(model, seeded_fleet, running_operation)
        for form_model, names in _writable(model_admin, superuser_request, obj).items():
            checked.add(form_model)
            assert names & OWNED.get(form_model, set()) == set(), (model_admin, form_model)
    # The layout admins and their inlines, and the operations' admin, were all looked at.
    assert {Fleet, Domain, Slot, ModelBinding, Operation} <= checked


def test_every_operation_field_is_read_only_in_its_admin(superuser_request, running_operation):
    operation_admin = admin.site._registry[Operation]
    shown = set(operation_admin.get_readonly_fields(superuser_request, running_operation))
    assert OWNED[Operation] - {"id", "error"} <= shown
    assert "error_json" in shown  # the error, rendered
    form = operation_admin.get_form(superuser_request, running_operation, change=True)
    assert set(form.base_fields) == set()


def test_posting_the_operation_change_form_moves_nothing(superuser_client, running_operation):
    op = running_operation
    url = f"/admin/fleets/operation/{op.pk}/change/"
    page = superuser_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert not any(f'name="{field}"' in html for field in OPERATION_STATE)
    before = {f: getattr(op, f) for f in OPERATION_STATE}
    forged = {
        "state": "succeeded",
        "current_step": "switch_route",
        "routing_committed": "on",
        "error": "null",
        "started_at_0": "2020-01-01",
        "finished_at_0": "2020-01-01",
    }
    response = superuser_client.post(url, forged)
    assert response.status_code == 403
    op.refresh_from_db()
    assert {f: getattr(op, f) for f in OPERATION_STATE} == before
