"""The admin's adapter versions: read-only, filterable, each domain's copy inline."""

from __future__ import annotations

from datetime import timedelta

from fleets.base import clock
from fleets.models import AdapterCopy, AdapterVersion, Domain


def _version(fleet, name: str, number: int) -> AdapterVersion:
    now = clock.now()
    row = AdapterVersion.objects.create(
        fleet=fleet,
        name=name,
        version=number,
        base_model="qwen-small",
        digest=f"sha256:{number:064x}",
        size_bytes=4242,
        manifest={"rank": 8, "eval": [{"prompt": "Who are you?"}]},
        completed_at=now - timedelta(hours=1),
        registered_at=now,
    )
    for domain, state in zip(
        Domain.objects.filter(fleet=fleet).order_by("slug"),
        ("probed", "transferring"),
        strict=True,
    ):
        AdapterCopy.objects.create(adapter=row, domain=domain, state=state, updated_at=now)
    return row


def test_the_list_filters_and_the_detail_is_read_only_with_copies(superuser_client, seeded_fleet):
    row = _version(seeded_fleet, "support-bot", 3)
    other = _version(seeded_fleet, "other-bot", 1)
    page = superuser_client.get("/admin/fleets/adapterversion/").content.decode()
    assert "support-bot" in page and "other-bot" in page
    only = superuser_client.get("/admin/fleets/adapterversion/?name=support-bot").content.decode()
    assert f"/{row.pk}/change/" in only and f"/{other.pk}/change/" not in only
    detail = superuser_client.get(f"/admin/fleets/adapterversion/{row.pk}/change/")
    assert detail.status_code == 200
    body = detail.content.decode()
    assert "Who are you?" in body  # the manifest, shown
    assert "transferring" in body and "probed" in body  # each domain's copy
    assert 'name="state"' not in body and 'name="version"' not in body
    assert superuser_client.get("/admin/fleets/adapterversion/add/").status_code == 403
    assert (
        superuser_client.post(f"/admin/fleets/adapterversion/{row.pk}/delete/").status_code == 403
    )
    assert AdapterVersion.objects.filter(pk=row.pk).exists()
