"""Deleting a fleet: the service refuses while an operation is in flight and archives history."""

from __future__ import annotations

import pytest

from fleets.base.errors import OperationConflict
from fleets.models import Domain, Event, Fleet, FleetArchive, Operation
from fleets.services.fleets import fleet_delete
from fleets.services.operations import operation_request

pytestmark = pytest.mark.django_db


def _finished_demotion(fleet) -> Operation:
    west = Domain.objects.get(fleet=fleet, slug="west")
    op = operation_request(fleet=fleet, kind="demote", target_domain_id=west.id).operation
    Operation.objects.filter(pk=op.pk).update(state="succeeded")
    return op


def test_delete_archives_layout_operations_and_events_then_removes_the_fleet(seeded_fleet):
    op = _finished_demotion(seeded_fleet)
    events = Event.objects.filter(fleet=seeded_fleet).count()

    archive = fleet_delete(fleet_id=seeded_fleet.id, actor="admin:root")

    assert not Fleet.objects.filter(pk=seeded_fleet.pk).exists()
    assert not Domain.objects.exists() and not Operation.objects.exists()
    archive.refresh_from_db()
    assert archive.slug == "demo" and archive.deleted_by == "admin:root"
    assert archive.layout["activeDomainSlug"] == "east"
    assert [o["id"] for o in archive.operations] == [str(op.id)]
    assert archive.operations[0]["targetDomainSlug"] == "west"
    assert len(archive.events) == events > 0


def test_delete_is_refused_while_an_operation_is_in_flight(seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    operation_request(fleet=seeded_fleet, kind="demote", target_domain_id=west.id)

    with pytest.raises(OperationConflict, match="in flight"):
        fleet_delete(fleet_id=seeded_fleet.id, actor="admin:root")

    assert Fleet.objects.filter(pk=seeded_fleet.pk).exists()
    assert not FleetArchive.objects.exists()


def test_a_superuser_deletes_a_fleet_from_admin(superuser_client, seeded_fleet):
    _finished_demotion(seeded_fleet)
    url = f"/admin/fleets/fleet/{seeded_fleet.pk}/delete/"

    page = superuser_client.get(url)
    assert page.status_code == 200
    assert b"permission to delete" not in page.content
    assert b"archived, not lost" in page.content

    done = superuser_client.post(url, {"post": "yes"})
    assert done.status_code == 302
    assert not Fleet.objects.exists()
    assert FleetArchive.objects.get().slug == "demo"
    assert superuser_client.get("/admin/fleets/fleetarchive/").status_code == 200


def test_admin_shows_the_in_flight_operation_and_deletes_nothing(superuser_client, seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    operation_request(fleet=seeded_fleet, kind="demote", target_domain_id=west.id)
    url = f"/admin/fleets/fleet/{seeded_fleet.pk}/delete/"

    page = superuser_client.get(url)
    assert b"demote of west is in flight" in page.content
    superuser_client.post(url, {"post": "yes"})

    assert Fleet.objects.filter(pk=seeded_fleet.pk).exists()
