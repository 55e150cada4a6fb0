"""Layouts with domains Haru provisions: no URLs needed, placement and driver checked, and
re-applying or exporting never touches what provisioning owns."""

from __future__ import annotations

import pytest

from fleets.base.errors import LayoutError
from fleets.layouts.loader import load_layout, parse_layout
from fleets.models import Domain, Fleet, ModelBinding
from fleets.services.layouts import layout_apply, layout_export
from tests.conftest import ROOT
from tests.drivers.managed_layout import managed_layout


def _refused(data) -> list[str]:
    with pytest.raises(LayoutError) as err:
        parse_layout(data)
    return err.value.errors


def test_a_provisioned_domain_needs_no_urls():
    layout = parse_layout(managed_layout())
    west = layout.domains[1]
    assert (west.supervisor_url, west.serving_base_url) == ("", "")
    assert west.driver["servingPort"] == 18001


def test_the_two_cloud_example_is_valid():
    layout = load_layout(ROOT / "examples" / "fleet.two-cloud.yaml")
    assert {d.provider for d in layout.domains} == {"skypilot", "skyserve"}
    assert all(d.driver for d in layout.domains)


def test_the_script_example_is_valid():
    layout = load_layout(ROOT / "examples" / "fleet.script-domain.yaml")
    rack7 = next(d for d in layout.domains if d.provider == "script")
    assert rack7.driver["launch"] == ["/opt/haru/bin/node", "launch", "gpu-07"]
    assert rack7.supervisor_url == ""


def test_a_static_domain_still_needs_its_serving_urls():
    data = managed_layout()
    del data["domains"][0]["servingBaseUrl"]
    assert any("domains[0].slots[0].models[0].servingUrl" in e for e in _refused(data))


def test_placement_driver_and_supervisor_config_errors_name_the_field():
    data = managed_layout()
    west = data["domains"][1]
    west["placement"]["accelerator"] = "H900"
    west["driver"]["supervisorConfig"]["slots"][0]["gpuIndex"] = -1
    errors = _refused(data)
    assert any(
        e.startswith("domains[1].placement.accelerator: unknown aws accelerator") for e in errors
    )
    assert any(e.startswith("domains[1].driver.supervisorConfig.slots[0].gpuIndex") for e in errors)


def test_a_static_domain_cannot_have_driver_settings():
    data = managed_layout()
    data["domains"][0]["driver"] = data["domains"][1]["driver"]
    assert any(
        "domains[0].driver: a static domain is never provisioned" in e for e in _refused(data)
    )


def test_reapplying_keeps_the_urls_provisioning_recorded(db):
    layout_apply(layout=parse_layout(managed_layout()))
    Domain.objects.filter(slug="west").update(
        supervisor_url="http://1.2.3.4:8701", serving_base_url="http://1.2.3.4:18001"
    )
    ModelBinding.objects.filter(domain__slug="west").update(serving_url="http://1.2.3.4:18001")
    layout_apply(layout=parse_layout(managed_layout()))
    west = Domain.objects.get(slug="west")
    assert west.supervisor_url == "http://1.2.3.4:8701"
    assert ModelBinding.objects.get(domain=west).serving_url == "http://1.2.3.4:18001"


def test_export_keeps_the_driver_and_leaves_out_provisioned_urls(db):
    layout_apply(layout=parse_layout(managed_layout()))
    Domain.objects.filter(slug="west").update(supervisor_url="http://1.2.3.4:8701")
    doc = layout_export(Fleet.objects.get(slug="prov"))
    west = doc["domains"][1]
    assert west["driver"] == managed_layout()["domains"][1]["driver"]
    assert "supervisorUrl" not in west
    assert "servingUrl" not in west["slots"][0]["models"][0]
    assert parse_layout(doc).domains[1].driver == west["driver"]
