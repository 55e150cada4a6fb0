"""The admin's "Cancel the selected in-flight operations": confirm first, then the service."""

from __future__ import annotations

from fleets.models import Domain, Event, Operation
from fleets.services.operations import operation_request, operation_start, operation_step_done
from fleets.services.route_pointer import route_switch


def _running(fleet) -> Operation:
    west = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="promote", target_domain_id=west.id).operation
    operation_start(operation_id=op.id)
    return op


def _action(client, pks, confirm: bool):
    data = {"action": "cancel_operations", "_selected_action": [str(pk) for pk in pks]}
    if confirm:
        data["confirm"] = "yes"
    return client.post("/admin/fleets/operation/", data, follow=confirm)


def test_the_changelist_offers_the_cancel_action(superuser_client, seeded_fleet):
    _running(seeded_fleet)
    page = superuser_client.get("/admin/fleets/operation/")
    assert 'value="cancel_operations"' in page.content.decode()


def test_cancel_action_confirms_then_cancels_through_the_service(superuser_client, seeded_fleet):
    op = _running(seeded_fleet)
    page = _action(superuser_client, [op.pk], confirm=False)
    assert page.status_code == 200 and b"Cancel these operations?" in page.content
    assert Operation.objects.get(pk=op.pk).state == "running"

    done = _action(superuser_client, [op.pk], confirm=True)
    op.refresh_from_db()
    assert (op.state, op.cleanup) == ("cancelled", "pending")
    assert "promote of west cancelled" in done.content.decode()
    assert Event.objects.get(operation=op, kind="operation.cancelled").actor == "admin:root"


def test_cancelling_a_finished_operation_reports_the_409(superuser_client, seeded_fleet):
    op = _running(seeded_fleet)
    _action(superuser_client, [op.pk], confirm=True)
    again = _action(superuser_client, [op.pk], confirm=True)
    assert "already finished (cancelled)" in again.content.decode()
    assert Event.objects.filter(operation=op, kind="operation.cancelled").count() == 1


def test_cancelling_a_promotion_that_moved_routing_says_it_succeeded_without_its_steps(
    superuser_client, seeded_fleet
):
    op = _running(seeded_fleet)
    Operation.objects.filter(pk=op.pk).update(current_step="switch_route")
    assert route_switch(
        fleet_id=seeded_fleet.id,
        operation_id=op.id,
        target_domain_id=op.target_domain_id,
        expected_active_id=op.source_domain_id,
        expected_revision=1,
    )
    assert operation_step_done(operation_id=op.id, step="switch_route")

    done = _action(superuser_client, [op.pk], confirm=True)

    op.refresh_from_db()
    assert op.state == "succeeded"
    assert "had already moved routing: it ends succeeded without demote_old_sleep" in (
        done.content.decode()
    )
    skipped = Event.objects.filter(operation=op, kind="operation.step.skipped")
    assert {e.actor for e in skipped} == {"admin:root"}
