"""`manage.py sky_render`: the YAML for review, secrets as references, clear refusals."""

from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from fleets.models import Domain
from tests.drivers.managed_layout import seed_managed_fleet


def render(*args: str) -> str:
    out = StringIO()
    call_command("sky_render", *args, stdout=out)
    return out.getvalue()


def test_prints_the_task_with_the_secret_as_a_reference(db, settings):
    settings.HARU = {**settings.HARU, "supervisor_token": "never-print-this-token-123"}
    seed_managed_fleet()
    text = render("prov", "west")
    assert "never-print-this-token-123" not in text
    assert "--secret HARU_SUPERVISOR_TOKEN" in text
    doc = yaml.safe_load(text)
    assert doc["name"] == "haru-prov-west"
    assert doc["resources"]["infra"] == "aws/us-east-1"
    assert doc["secrets"] == {
        "HARU_SUPERVISOR_TOKEN": None,
        "HARU_SUPERVISOR_TLS_CERT_PEM": None,
        "HARU_SUPERVISOR_TLS_KEY_PEM": None,
    }
    assert "# launch order: >us-east-1,  us-west-2" in text


def test_renders_another_candidate_on_request(db):
    seed_managed_fleet()
    assert yaml.safe_load(render("prov", "west", "--candidate", "1"))["resources"]["infra"] == (
        "aws/us-west-2"
    )
    with pytest.raises(CommandError, match="--candidate must be 0 to 1"):
        render("prov", "west", "--candidate", "2")


def test_refuses_static_unknown_and_broken_domains(db):
    seed_managed_fleet()
    with pytest.raises(CommandError, match="not provisioned by Haru"):
        render("prov", "east")
    with pytest.raises(CommandError, match="not in fleet"):
        render("prov", "north")
    with pytest.raises(CommandError, match="not found"):
        render("nope", "west")
    Domain.objects.filter(slug="west").update(
        placement={"cloud": "aws", "region": "us-east-1", "accelerator": "H900"}
    )
    with pytest.raises(CommandError, match=r"placement.accelerator: unknown aws accelerator"):
        render("prov", "west")
