"""The admin refuses supervisor and serving URLs with credentials, and supervisor hosts outside
HARU_SUPERVISOR_HOSTS, on the field, writing nothing."""

from __future__ import annotations

import pytest

from fleets.models import Domain, ModelBinding

pytestmark = pytest.mark.django_db

SECRET = "hunter2-secret"


def test_the_admin_refuses_credentials_and_disallowed_hosts(
    seeded_fleet, superuser_client, admin_form, settings
):
    east = Domain.objects.get(slug="east")
    url = f"/admin/fleets/domain/{east.pk}/change/"
    data = admin_form(superuser_client.get(url).content.decode(), "domain_form")
    data["supervisor_url"] = f"http://ops:{SECRET}@127.0.0.1:8701"
    response = superuser_client.post(url, data)
    assert response.status_code == 200
    assert "must not carry credentials" in str(response.context["adminform"].form.errors)
    data["supervisor_url"] = "http://127.0.0.1:8701"
    data["serving_base_url"] = f"http://{SECRET}@127.0.0.1:18001"
    response = superuser_client.post(url, data)
    assert "must not carry credentials" in str(response.context["adminform"].form.errors)
    settings.HARU = {**settings.HARU, "supervisor_hosts": ("*.gpu.internal",)}
    data["serving_base_url"] = "http://127.0.0.1:18001"
    response = superuser_client.post(url, data)
    assert "not in HARU_SUPERVISOR_HOSTS" in str(response.context["adminform"].form.errors)
    east.refresh_from_db()
    assert east.supervisor_url == "http://127.0.0.1:8701" and SECRET not in east.serving_base_url
    data["supervisor_url"] = "https://east.gpu.internal:8701"
    assert superuser_client.post(url, data).status_code == 302
    east.refresh_from_db()
    assert east.supervisor_url == "https://east.gpu.internal:8701"


def test_a_url_stored_with_credentials_is_never_shown_and_a_save_strips_it(
    seeded_fleet, superuser_client, admin_form
):
    east = Domain.objects.get(slug="east")
    Domain.objects.filter(pk=east.pk).update(
        supervisor_url=f"http://ops:{SECRET}@127.0.0.1:8701",
        serving_base_url=f"http://{SECRET}@127.0.0.1:18001",
    )
    ModelBinding.objects.filter(domain=east).update(
        serving_url=f"http://u:{SECRET}@127.0.0.1:18001"
    )
    url = f"/admin/fleets/domain/{east.pk}/change/"
    page = superuser_client.get(url).content.decode()
    assert SECRET not in page and "ops:" not in page
    assert 'value="http://127.0.0.1:8701"' in page
    fleet_page = superuser_client.get(f"/admin/fleets/fleet/{east.fleet_id}/change/")
    assert SECRET not in fleet_page.content.decode()
    assert superuser_client.post(url, admin_form(page, "domain_form")).status_code == 302
    east.refresh_from_db()
    assert (east.supervisor_url, east.serving_base_url) == (
        "http://127.0.0.1:8701",
        "http://127.0.0.1:18001",
    )
    assert not ModelBinding.objects.filter(serving_url__contains=SECRET).exists()


@pytest.mark.parametrize("field", ["supervisor_url", "serving_base_url"])
@pytest.mark.parametrize("suffix", ["/?key=k-1", "#top", "?"])
def test_the_admin_refuses_a_url_with_a_query_or_fragment(
    seeded_fleet, superuser_client, admin_form, field, suffix
):
    east = Domain.objects.get(slug="east")
    url = f"/admin/fleets/domain/{east.pk}/change/"
    data = admin_form(superuser_client.get(url).content.decode(), "domain_form")
    before = data[field]
    data[field] = before + suffix
    response = superuser_client.post(url, data)
    assert response.status_code == 200
    assert "must not carry a query" in str(response.context["adminform"].form.errors)
    east.refresh_from_db()
    assert getattr(east, field) == before


def test_the_admin_refuses_a_model_serving_url_with_a_query(
    seeded_fleet, superuser_client, admin_form
):
    east = Domain.objects.get(slug="east")
    url = f"/admin/fleets/domain/{east.pk}/change/"
    data = admin_form(superuser_client.get(url).content.decode(), "domain_form")
    key = next(k for k in data if k.endswith("-serving_url") and data[k])
    before = data[key]
    data[key] = before + "?tenant=a"
    response = superuser_client.post(url, data)
    assert response.status_code == 200
    assert "must not carry a query" in response.content.decode()
    assert not ModelBinding.objects.filter(serving_url__contains="?").exists()
