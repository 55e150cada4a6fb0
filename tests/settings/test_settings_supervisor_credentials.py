"""`manage.py supervisor_token` prints a domain's derived token; the credential settings are
validated at start-up (a typo stops it, never a silent fallback)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleets.core.credentials import derive_supervisor_token
from fleets.models import Domain
from haru import env

MASTER = "master-key-for-tests-0123456789abcdefghij"


def _run(*args: str) -> str:
    out = StringIO()
    call_command("supervisor_token", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_prints_only_the_domains_own_token(seeded_fleet, settings):
    settings.HARU = {**settings.HARU, "supervisor_master_key": MASTER}
    east, west = (Domain.objects.get(slug=s) for s in ("east", "west"))
    printed = _run("demo/east").strip()
    assert printed == derive_supervisor_token(MASTER, east.id)
    assert _run("demo/west").strip() == derive_supervisor_token(MASTER, west.id) != printed
    assert MASTER not in printed


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("demo/north", "no domain 'demo/north': fleet 'demo' has domains: east, west"),
        ("nope/east", "no domain 'nope/east': no fleet 'nope'"),
        ("east", "give the domain as <fleet>/<domain>"),
        ("demo/east/x", "give the domain as <fleet>/<domain>"),
        ("/east", "give the domain as <fleet>/<domain>"),
    ],
)
def test_the_command_refuses_unknown_refs_clearly(seeded_fleet, settings, ref, message):
    settings.HARU = {**settings.HARU, "supervisor_master_key": MASTER}
    with pytest.raises(CommandError, match=message):
        _run(ref)


@pytest.mark.django_db
def test_the_command_needs_the_master_key(seeded_fleet, settings):
    settings.HARU = {**settings.HARU, "supervisor_master_key": None, "supervisor_token": "x" * 40}
    with pytest.raises(CommandError, match="HARU_SUPERVISOR_MASTER_KEY is not set"):
        _run("demo/east")


def test_supervisor_hosts_are_validated(tmp_path):
    assert env.host_patterns("H", {"H": "10.0.0.0/8, GPU-*.internal"}) == (
        "10.0.0.0/8",
        "gpu-*.internal",
    )
    assert env.host_patterns("H", {}) == ()
    with pytest.raises(env.ConfigError, match="H: '300.0.0.0/8' is not a network"):
        env.host_patterns("H", {"H": "300.0.0.0/8"})


def test_the_ca_bundle_must_exist(tmp_path):
    bundle = tmp_path / "ca.pem"
    with pytest.raises(env.ConfigError, match="HARU_SUPERVISOR_CA_BUNDLE: no such file"):
        env.existing_file("HARU_SUPERVISOR_CA_BUNDLE", {"HARU_SUPERVISOR_CA_BUNDLE": str(bundle)})
    bundle.write_text("pem")
    found = env.existing_file(
        "HARU_SUPERVISOR_CA_BUNDLE", {"HARU_SUPERVISOR_CA_BUNDLE": str(bundle)}
    )
    assert found == str(bundle)
