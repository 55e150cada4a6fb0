"""The layout's supervisorTransport and supervisorFingerprint: http:// beyond loopback is refused
unless plain-http is said by name, a pin is stored in one normal form and exported back, a
provisioned SkyPilot domain's pin belongs to its launches, and the migration keeps the
supervisors an upgraded install already called over http://."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from fleets.admin.forms import DomainForm
from fleets.base.errors import LayoutError
from fleets.core.supervisor_tls import transport_problem
from fleets.layouts.loader import parse_layout
from fleets.models import Domain, Fleet
from fleets.reads.shapes import domain_json
from fleets.services.layouts import layout_apply, layout_export
from tests.drivers.managed_layout import managed_layout

PIN = "sha256:" + "0123456789abcdef" * 4
OPENSSL_FORM = ":".join(PIN[7:][i : i + 2].upper() for i in range(0, 64, 2))
PLAIN_RULE = "http:// beyond loopback sends the supervisor token in clear"


@pytest.mark.parametrize(
    ("url", "transport", "pin", "field", "words"),
    [
        ("http://10.0.0.11:8701", "tls", "", "supervisorUrl", PLAIN_RULE),
        ("http://gpu-a.internal:8701", "tls", "", "supervisorUrl", PLAIN_RULE),
        ("http://[2001:db8::1]:8701", "tls", "", "supervisorUrl", PLAIN_RULE),
        ("http://10.0.0.11:8701", "tls", PIN, "supervisorFingerprint", "must be https://"),
        ("https://10.0.0.11:8701", "plain-http", "", "supervisorTransport", "goes with an http"),
        ("https://10.0.0.11:8701", "tls", "sha1:abc", "supervisorFingerprint", "64 hex digits"),
        ("https://10.0.0.11:8701", "carrier-pigeon", "", "supervisorTransport", "tls or plain"),
    ],
)
def test_refused_combinations_name_the_field(url, transport, pin, field, words):
    problem = transport_problem(url, transport, pin)
    assert problem is not None and problem[0] == field and words in problem[1]


@pytest.mark.parametrize(
    ("url", "transport", "pin"),
    [
        ("http://127.0.0.1:8701", "tls", ""),
        ("http://localhost:8701", "tls", ""),
        ("http://[::1]:8701", "tls", ""),
        ("http://10.0.0.11:8701", "plain-http", ""),
        ("https://10.0.0.11:8701", "tls", ""),
        ("https://10.0.0.11:8701", "tls", PIN),
        ("", "tls", ""),
    ],
)
def test_accepted_combinations(url, transport, pin):
    assert transport_problem(url, transport, pin) is None


def test_the_loader_refuses_plain_http_beyond_loopback_and_nothing_is_written(db, layout_data):
    layout_data["domains"][1]["supervisorUrl"] = "http://10.0.0.12:8702"
    with pytest.raises(LayoutError) as refused:
        parse_layout(layout_data)
    assert refused.value.errors == [
        f"domains[1].supervisorUrl: {transport_problem('http://10.0.0.12:8702', 'tls', '')[1]}"
    ]
    assert "supervisorTransport: plain-http" in refused.value.errors[0]
    assert not Fleet.objects.exists()


def test_plain_http_by_name_is_stored_shown_and_exported(db, layout_data):
    layout_data["domains"][1]["supervisorUrl"] = "http://10.0.0.12:8702"
    layout_data["domains"][1]["supervisorTransport"] = "plain-http"
    layout_apply(layout=parse_layout(layout_data))
    west = Domain.objects.get(slug=layout_data["domains"][1]["slug"])
    assert west.supervisor_transport == "plain-http" and west.supervisor_fingerprint == ""
    exported = layout_export(west.fleet)["domains"]
    assert exported[1]["supervisorTransport"] == "plain-http"
    assert "supervisorTransport" not in exported[0]  # the default is left out
    assert parse_layout(layout_export(west.fleet))  # the export applies unchanged


def test_a_pin_in_openssls_form_is_stored_in_one_form_and_shown(db, layout_data):
    layout_data["domains"][1]["supervisorUrl"] = "https://10.0.0.12:8702"
    layout_data["domains"][1]["supervisorFingerprint"] = OPENSSL_FORM
    layout_apply(layout=parse_layout(layout_data))
    west = Domain.objects.get(slug=layout_data["domains"][1]["slug"])
    assert west.supervisor_fingerprint == PIN
    shown = domain_json(west, slots=[], bindings=[], active_domain_id=None, backoff=None)
    assert shown["supervisorFingerprint"] == PIN and shown["supervisorTransport"] == "tls"
    assert layout_export(west.fleet)["domains"][1]["supervisorFingerprint"] == PIN
    # Dropping it from the layout drops the pin: the layout owns a static domain's trust.
    del layout_data["domains"][1]["supervisorFingerprint"]
    layout_apply(layout=parse_layout(layout_data))
    assert Domain.objects.get(pk=west.pk).supervisor_fingerprint == ""


def test_a_skypilot_domains_pin_is_its_launches_not_the_layouts(db):
    data = managed_layout()
    data["domains"][1]["supervisorFingerprint"] = PIN
    data["domains"][1]["supervisorTransport"] = "plain-http"
    with pytest.raises(LayoutError) as refused:
        parse_layout(data)
    assert refused.value.errors == [
        f"domains[1].{key}: a skypilot domain's certificate is made and pinned by the control "
        "plane at each launch (always HTTPS); drop this field"
        for key in ("supervisorTransport", "supervisorFingerprint")
    ]
    # Re-applying the layout keeps the pin (and URL) a launch recorded.
    data = managed_layout()
    layout_apply(layout=parse_layout(data))
    Domain.objects.filter(slug="west").update(
        supervisor_url="https://3.3.3.4:8701", supervisor_fingerprint=PIN
    )
    layout_apply(layout=parse_layout(data))
    west = Domain.objects.get(slug="west")
    assert (west.supervisor_url, west.supervisor_fingerprint) == ("https://3.3.3.4:8701", PIN)
    assert "supervisorFingerprint" not in layout_export(west.fleet)["domains"][1]


def test_the_admin_refuses_plain_http_beyond_loopback(db, seeded_fleet):
    east = Domain.objects.get(fleet=seeded_fleet, slug="east")
    data = {
        "slug": east.slug,
        "display_name": "",
        "provider": "static",
        "priority": 10,
        "placement": "{}",
        "driver": "{}",
        "supervisor_url": "http://10.0.0.11:8701",
        "supervisor_transport": "tls",
        "supervisor_fingerprint": "",
        "serving_base_url": "http://10.0.0.11:8000",
        "gpu_layout": "{}",
    }
    form = DomainForm(data=data, instance=east)
    assert not form.is_valid()
    assert PLAIN_RULE in str(form.errors["supervisor_url"])
    form = DomainForm(data={**data, "supervisor_transport": "plain-http"}, instance=east)
    assert form.is_valid(), form.errors
    pinned = {**data, "supervisor_url": "https://10.0.0.11:8701"}
    form = DomainForm(data={**pinned, "supervisor_fingerprint": OPENSSL_FORM}, instance=east)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["supervisor_fingerprint"] == PIN


def test_the_migration_marks_rows_already_on_plain_http_beyond_loopback(db, seeded_fleet):
    migration = importlib.import_module("fleets.migrations.0003_domain_supervisor_tls")
    east, west = Domain.objects.filter(fleet=seeded_fleet).order_by("priority")
    Domain.objects.filter(pk=east.pk).update(supervisor_url="http://10.0.0.11:8701")
    Domain.objects.filter(pk=west.pk).update(supervisor_url="http://127.0.0.1:8702")
    migration.mark_plain_http(apps, None)
    assert Domain.objects.get(pk=east.pk).supervisor_transport == "plain-http"
    assert Domain.objects.get(pk=west.pk).supervisor_transport == "tls"
