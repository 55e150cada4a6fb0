"""The adapter registry's writes: version numbers under a race, idempotent registration, copies
moved only by a compare-and-swap on their token, retirement keeping the row."""

from __future__ import annotations

import pytest

from common.adapter_manifest import ManifestInvalid
from fleets.core.adapters import CopyState
from fleets.models import AdapterCopy, AdapterVersion, Domain, Event
from fleets.services.adapters import adapter_register, adapter_retire, copy_move
from tests.reconciler.fake_adapters import make_adapter
from tests.state.test_state_races import run_together


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_take_distinct_numbers_and_one_digest_once(seeded_fleet):
    fleet = seeded_fleet
    west = Domain.objects.get(fleet=fleet, slug="west")
    # 8 distinct adapters of one name, each registered by 2 threads at once.
    manifests = [make_adapter("bot", weights=bytes([i]) * 50)[0] for i in range(8)]

    def register(i: int):
        reg = adapter_register(
            fleet_id=fleet.id, manifest=manifests[i % 8], source_domain_id=west.id
        )
        return reg.version.version, reg.created

    results = run_together(16, register)
    numbers = sorted(AdapterVersion.objects.filter(fleet=fleet).values_list("version", flat=True))
    assert numbers == list(range(1, 9))
    assert sum(created for _, created in results) == 8
    # Both registrations of one digest got the same version.
    by_manifest: dict[int, set[int]] = {}
    for i, (number, _) in enumerate(results):
        by_manifest.setdefault(i % 8, set()).add(number)
    assert all(len(n) == 1 for n in by_manifest.values())
    assert Event.objects.filter(fleet=fleet, kind="adapter.registered").count() == 8


@pytest.mark.django_db
def test_a_registration_creates_a_copy_per_binding_domain_stored_on_its_source(seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    reg = adapter_register(
        fleet_id=seeded_fleet.id, manifest=make_adapter("bot")[0], source_domain_id=west.id
    )
    copies = {c.domain.slug: c.state for c in AdapterCopy.objects.filter(adapter=reg.version)}
    assert copies == {"west": "stored", "east": "absent"}


@pytest.mark.django_db
def test_a_manifest_off_the_contract_is_refused_with_nothing_written(seeded_fleet):
    manifest = make_adapter("bot")[0]
    manifest["files"] = []
    with pytest.raises(ManifestInvalid, match="files"):
        adapter_register(fleet_id=seeded_fleet.id, manifest=manifest, source_domain_id=None)
    assert not AdapterVersion.objects.exists()
    assert not Event.objects.filter(kind__startswith="adapter.").exists()


@pytest.mark.django_db
def test_a_copy_moves_only_from_the_token_it_was_read_at(seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    reg = adapter_register(
        fleet_id=seeded_fleet.id, manifest=make_adapter("bot")[0], source_domain_id=west.id
    )
    first = AdapterCopy.objects.select_related("adapter").get(
        adapter=reg.version, domain__slug="east"
    )
    stale = AdapterCopy.objects.select_related("adapter").get(pk=first.pk)
    assert copy_move(copy=first, to_state=CopyState.TRANSFERRING)
    assert not copy_move(copy=stale, to_state=CopyState.FAILED, why="late")
    row = AdapterCopy.objects.get(pk=first.pk)
    assert (row.state, row.why) == ("transferring", "")
    assert Event.objects.filter(kind="adapter.copy.failed").count() == 0


@pytest.mark.django_db
def test_retiring_keeps_the_row_and_removes_every_copy(seeded_fleet):
    reg = adapter_register(
        fleet_id=seeded_fleet.id, manifest=make_adapter("bot")[0], source_domain_id=None
    )
    assert adapter_retire(version=reg.version)
    assert not adapter_retire(version=reg.version)  # once
    v = AdapterVersion.objects.get(pk=reg.version.pk)
    assert v.state == "retired"
    assert set(AdapterCopy.objects.filter(adapter=v).values_list("state", flat=True)) == {"removed"}
