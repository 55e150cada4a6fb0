"""Cloud placement validation and the SkyPilot / SkyServe renderers (pure, no SkyPilot)."""

from __future__ import annotations

import json

import pytest
import yaml

from fleets.drivers.cloud_placement import (
    Candidate,
    CloudPlacementError,
    catalogue,
    parse_cloud_placement,
    parse_driver_settings,
)
from fleets.drivers.render import cluster_name, for_review, render_for, render_service, render_task

BASE = {"cloud": "aws", "region": "us-east-1", "accelerator": "H100"}
CONFIG = {"host": "east", "slots": [{"kind": "inference", "gpuIndex": 0, "models": []}]}


def placement(**extra):
    return parse_cloud_placement({**BASE, **extra})


def settings(provider="skypilot", **extra):
    return parse_driver_settings({"supervisorConfig": CONFIG, **extra}, provider=provider)


def task(**kw):
    return render_task(
        name="haru-demo-east",
        placement=kw.pop("p", placement()),
        settings=kw.pop("s", settings()),
        **kw,
    ).document


# -- placement fields -------------------------------------------------------------------------


def test_cloud_and_region_become_the_infra_string():
    assert task()["resources"]["infra"] == "aws/us-east-1"


def test_a_zone_pins_the_infra_string_to_it():
    p = placement(zones=["us-east-1b"])
    assert task(p=p)["resources"]["infra"] == "aws/us-east-1/us-east-1b"


def test_accelerator_and_count_render_as_name_colon_count():
    p = placement(acceleratorCount=4)
    assert task(p=p)["resources"]["accelerators"] == "H100:4"


def test_count_defaults_to_one():
    assert task()["resources"]["accelerators"] == "H100:1"


@pytest.mark.parametrize("spot", [True, False])
def test_spot_is_rendered_as_use_spot(spot):
    assert task(p=placement(useSpot=spot))["resources"]["use_spot"] is spot


def test_disk_size_is_rendered_only_when_given():
    assert "disk_size" not in task()["resources"]
    assert task(p=placement(diskSizeGb=512))["resources"]["disk_size"] == 512


def test_image_is_rendered_as_image_id():
    p = placement(image="ami-0123456789abcdef0")
    assert task(p=p)["resources"]["image_id"] == "ami-0123456789abcdef0"
    assert "image_id" not in task()["resources"]


def test_ports_open_the_supervisor_and_the_serving_endpoint():
    assert task()["resources"]["ports"] == [8701]
    s = settings(supervisorPort=9701, servingPort=8000)
    assert task(s=s)["resources"]["ports"] == [9701, 8000]


def test_candidates_try_each_zone_then_each_fallback_region():
    p = placement(zones=["us-east-1a", "us-east-1b"], fallbackRegions=["us-west-2", "us-east-2"])
    assert [c.label() for c in p.candidates()] == [
        "us-east-1/us-east-1a",
        "us-east-1/us-east-1b",
        "us-west-2",
        "us-east-2",
    ]


def test_a_fallback_candidate_renders_its_own_region():
    p = placement(fallbackRegions=["us-west-2"])
    assert task(p=p, candidate=Candidate("us-west-2"))["resources"]["infra"] == "aws/us-west-2"


def test_gcp_placements_use_gcp_names():
    p = parse_cloud_placement(
        {"cloud": "gcp", "region": "us-central1", "zones": ["us-central1-a"], "accelerator": "L4"}
    )
    assert task(p=p)["resources"]["infra"] == "gcp/us-central1/us-central1-a"


# -- the supervisor as the run command, the token as a secret ----------------------------------


def test_the_supervisor_is_the_run_command_with_its_config_inline():
    doc = task()
    assert doc["run"].strip() == "exec python3 -m supervisor"
    assert json.loads(doc["envs"]["HARU_SUPERVISOR_CONFIG"]) == CONFIG
    assert doc["envs"]["HARU_SUPERVISOR_HOST"] == "0.0.0.0"
    assert doc["envs"]["PORT"] == "8701"


SECRETS = ("HARU_SUPERVISOR_TOKEN", "HARU_SUPERVISOR_TLS_CERT_PEM", "HARU_SUPERVISOR_TLS_KEY_PEM")


def test_the_token_and_tls_identity_are_secret_references_never_values():
    rendered = render_task(name="n", placement=placement(), settings=settings())
    assert rendered.document["secrets"] == dict.fromkeys(SECRETS)
    assert not set(SECRETS) & set(rendered.document["envs"])
    assert "HARU_SUPERVISOR_TLS" not in rendered.document["envs"]  # never plain-http
    assert rendered.secret_names == SECRETS


def test_review_text_shows_the_secret_as_a_reference():
    text = for_review(render_task(name="n", placement=placement(), settings=settings()))
    assert "--secret HARU_SUPERVISOR_TOKEN" in text
    assert "--secret HARU_SUPERVISOR_TLS_KEY_PEM" in text
    assert yaml.safe_load(text)["secrets"] == dict.fromkeys(SECRETS)


def test_setup_and_operator_envs_are_rendered():
    s = settings(setup="pip install haru", envs={"HF_HOME": "/data"})
    doc = task(s=s)
    assert doc["setup"] == "pip install haru\n"
    assert doc["envs"]["HF_HOME"] == "/data"


def test_rendered_text_round_trips_through_yaml():
    rendered = render_task(name="n", placement=placement(), settings=settings(setup="a\nb"))
    assert yaml.safe_load(rendered.text) == rendered.document
    assert "setup: |" in rendered.text


# -- SkyServe ------------------------------------------------------------------------------


def test_service_has_readiness_probe_replicas_and_replica_port():
    s = settings("skyserve", servingPort=8000, replicas=2, readinessPath="/v1/models")
    doc = render_service(name="n", placement=placement(), settings=s).document
    assert doc["service"]["readiness_probe"]["path"] == "/v1/models"
    assert doc["service"]["replicas"] == 2
    assert doc["service"]["ports"] == 8000
    assert doc["resources"]["ports"] == [8701, 8000]
    assert doc["secrets"] == dict.fromkeys(SECRETS)


def test_render_for_picks_the_document_by_provider():
    s = settings("skyserve", servingPort=8000)
    assert (
        "service"
        in render_for(provider="skyserve", name="n", placement=placement(), settings=s).document
    )
    assert (
        "service"
        not in render_for(
            provider="skypilot", name="n", placement=placement(), settings=settings()
        ).document
    )


def test_cluster_names_are_stable_and_bounded():
    assert cluster_name("demo", "east") == "haru-demo-east"
    long = cluster_name("a" * 40, "b" * 40)
    assert len(long) <= 35
    assert long == cluster_name("a" * 40, "b" * 40)
    assert long != cluster_name("a" * 40, "c" * 40)


# -- refusals name the field -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"region": "us-east-1", "accelerator": "H100"}, "placement.cloud", "required"),
        ({**BASE, "cloud": "azure"}, "placement.cloud", "unknown cloud"),
        ({**BASE, "region": "us-east-9"}, "placement.region", "unknown aws region"),
        ({**BASE, "zones": ["us-west-2a"]}, "placement.zones[0]", "unknown zone of us-east-1"),
        ({**BASE, "zones": "us-east-1a"}, "placement.zones", "list of strings"),
        ({**BASE, "zones": ["us-east-1a", "us-east-1a"]}, "placement.zones", "repeat"),
        ({**BASE, "fallbackRegions": ["us-east-1"]}, "placement.fallbackRegions[0]", "primary"),
        ({**BASE, "fallbackRegions": ["mars-1"]}, "placement.fallbackRegions[0]", "unknown"),
        ({**BASE, "accelerator": "H900"}, "placement.accelerator", "unknown aws accelerator"),
        ({**BASE, "acceleratorCount": 3}, "placement.acceleratorCount", "counts of 1, 2, 4, 8"),
        ({**BASE, "acceleratorCount": True}, "placement.acceleratorCount", "counts"),
        ({**BASE, "useSpot": "yes"}, "placement.useSpot", "true or false"),
        ({**BASE, "diskSizeGb": 10}, "placement.diskSizeGb", "from 50"),
        ({**BASE, "diskSizeGb": 10**6}, "placement.diskSizeGb", "from 50"),
        ({**BASE, "image": "ubuntu"}, "placement.image", "AMI"),
        ({**BASE, "cloud": "gcp", "region": "us-east-1"}, "placement.region", "unknown gcp region"),
        ({**BASE, "flavour": "x"}, "placement.flavour", "unknown field"),
        ("aws", "placement", "object"),
    ],
)
def test_impossible_placements_are_refused_naming_the_field(raw, path, words):
    with pytest.raises(CloudPlacementError) as err:
        parse_cloud_placement(raw)
    assert err.value.path == path
    assert words.lower() in err.value.rule.lower()


@pytest.mark.parametrize(
    ("raw", "provider", "path", "words"),
    [
        ({}, "skypilot", "driver.supervisorConfig", "required"),
        (
            {"supervisorConfig": {"slots": []}, "supervisorPort": 80},
            "skypilot",
            "driver.supervisorPort",
            "1024",
        ),
        (
            {"supervisorConfig": {"slots": []}, "servingPort": 8701},
            "skypilot",
            "driver.servingPort",
            "differ",
        ),
        (
            {"supervisorConfig": {"slots": []}},
            "skyserve",
            "driver.servingPort",
            "required for skyserve",
        ),
        (
            {"supervisorConfig": {"slots": []}, "replicas": 2},
            "skypilot",
            "driver.replicas",
            "skyserve",
        ),
        (
            {"supervisorConfig": {"slots": []}, "servingPort": 8000, "replicas": 99},
            "skyserve",
            "driver.replicas",
            "from 1",
        ),
        (
            {"supervisorConfig": {"slots": []}, "stopMode": "pause"},
            "skypilot",
            "driver.stopMode",
            "down",
        ),
        (
            {"supervisorConfig": {"slots": []}, "envs": {"HF_TOKEN": "x"}},
            "skypilot",
            "driver.envs.HF_TOKEN",
            "credential",
        ),
        (
            {"supervisorConfig": {"slots": []}, "envs": {"PORT": "1"}},
            "skypilot",
            "driver.envs.PORT",
            "Haru",
        ),
        (
            {"supervisorConfig": {"slots": []}, "envs": {"1X": "1"}},
            "skypilot",
            "driver.envs.1X",
            "name",
        ),
        (
            {"supervisorConfig": {"slots": [], "token": "abc"}},
            "skypilot",
            "driver.supervisorConfig",
            "token",
        ),
        (
            {"supervisorConfig": {"slots": []}, "supervisorCommand": "a\nb"},
            "skypilot",
            "driver.supervisorCommand",
            "line",
        ),
        (
            {"supervisorConfig": {"slots": []}, "readinessPath": "health"},
            "skypilot",
            "driver.readinessPath",
            "absolute",
        ),
        (
            {"supervisorConfig": {"slots": []}, "colour": 1},
            "skypilot",
            "driver.colour",
            "unknown field",
        ),
    ],
)
def test_impossible_driver_settings_are_refused_naming_the_field(raw, provider, path, words):
    with pytest.raises(CloudPlacementError) as err:
        parse_driver_settings(raw, provider=provider)
    assert err.value.path == path
    assert words.lower() in err.value.rule.lower()


def test_every_catalogue_zone_belongs_to_its_region():
    for cloud, known in catalogue().items():
        for region, zones in known["regions"].items():
            for zone in zones:
                assert zone.startswith(region), (cloud, region, zone)
        for counts in known["accelerators"].values():
            assert counts == sorted(set(counts)) and all(c >= 1 for c in counts)
