"""Admin: a domain's driver is one the registry knows, and its settings are checked by that
driver with the layout loader's wording, on the driver field."""

from __future__ import annotations

import json

import pytest

from fleets.models import Domain

pytestmark = pytest.mark.django_db

SCRIPT = {
    "launch": ["/opt/haru/bin/launch-node", "gpu-07"],
    "describe": ["/opt/haru/bin/describe-node", "gpu-07"],
    "stop": ["/opt/haru/bin/stop-node", "gpu-07"],
}


def _post(client, admin_form, domain: Domain, **changes):
    url = f"/admin/fleets/domain/{domain.pk}/change/"
    data = admin_form(client.get(url).content.decode(), "domain_form")
    data.update(changes)
    return client.post(url, data)


def test_a_script_domains_settings_are_saved(superuser_client, admin_form, seeded_fleet):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    response = _post(
        superuser_client, admin_form, west, provider="script", driver=json.dumps(SCRIPT)
    )
    assert response.status_code == 302
    west.refresh_from_db()
    assert (west.provider, west.driver) == ("script", SCRIPT)


@pytest.mark.parametrize(
    ("driver", "error"),
    [
        (
            {**SCRIPT, "launch": "/opt/haru/bin/launch-node gpu-07"},
            "driver.launch: must be a list of strings: the program, then its arguments (no shell)",
        ),
        (
            {**SCRIPT, "envs": {"BMC_PASSWORD": "hunter2"}},
            "driver.envs.BMC_PASSWORD: looks like a credential; envs are written in plain text, "
            "so keep credentials in the cloud's secret store or the image",
        ),
    ],
)
def test_bad_script_settings_are_an_error_on_the_driver_field(
    superuser_client, admin_form, seeded_fleet, driver, error
):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    before = (west.provider, west.driver)
    response = _post(
        superuser_client, admin_form, west, provider="script", driver=json.dumps(driver)
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["driver"] == [error]
    west.refresh_from_db()
    assert (west.provider, west.driver) == before


def test_a_provider_no_driver_is_registered_under_is_refused(
    superuser_client, admin_form, seeded_fleet
):
    west = Domain.objects.get(fleet=seeded_fleet, slug="west")
    response = _post(superuser_client, admin_form, west, provider="ipmi")
    assert response.status_code == 200
    assert list(response.context["adminform"].form.errors) == ["provider"]
    html = superuser_client.get(f"/admin/fleets/domain/{west.pk}/change/").content.decode()
    for name in ("static", "script", "skypilot", "skyserve"):
        assert f'<option value="{name}"' in html
