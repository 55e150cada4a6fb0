"""The admin refuses supervisor and serving URLs with credentials, and supervisor hosts outside
HARU_SUPERVISOR_HOSTS, on the field, writing nothing."""

from __future__ import annotations

import pytest

from fleets.models import Domain

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
