"""SkyPilot's own parsers accept every rendered example, and read back the fields we meant.

SkyPilot cannot share Haru's environment, so its parsers run in their own virtualenv
(`make sky-env`, or HARU_SKY_VENV) in one subprocess for all documents (its import takes
seconds). Without that environment the test skips, saying how to get it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from fleets.drivers.cloud_placement import parse_cloud_placement
from fleets.drivers.render import SECRET_NAMES, render_domain
from fleets.layouts.loader import read_layout_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skypilot


def _sky_python() -> Path:
    venv = os.environ.get("HARU_SKY_VENV") or str(ROOT / ".sky-venv")
    return Path(venv) / "bin" / "python"


SKYSERVE_EXTRA = {
    "slug": "serve-gcp",
    "provider": "skyserve",
    "placement": {
        "cloud": "gcp",
        "region": "europe-west4",
        "zones": ["europe-west4-b"],
        "accelerator": "A100",
        "acceleratorCount": 16,
        "diskSizeGb": 1024,
        "image": "projects/deeplearning-platform-release/global/images/common-cu124",
    },
    "driver": {
        "supervisorConfig": {"slots": []},
        "supervisorPort": 9701,
        "servingPort": 8080,
        "replicas": 3,
        "readinessPath": "/v1/models",
    },
}


def _examples() -> list[tuple[str, dict, dict]]:
    """Every driver-backed domain of every example layout, plus SkyServe extremes."""
    out = []
    for path in sorted((ROOT / "examples").glob("fleet.*")):
        layout = read_layout_file(path)
        for d in layout["domains"]:
            if "driver" in d and d["provider"] in ("skypilot", "skyserve"):
                out.append((f"{path.name}:{d['slug']}", layout, d))
    out.append(("extra:serve-gcp", {"slug": "extra"}, SKYSERVE_EXTRA))
    return out


def test_skypilot_parses_every_rendered_example_and_reads_our_fields(tmp_path):
    python = _sky_python()
    if not python.exists():
        pytest.skip(f"no SkyPilot environment at {python.parent.parent}: run `make sky-env`")
    cases, expected = [], {}
    examples = _examples()
    assert len(examples) >= 4  # the two-cloud example's three domains, and the extra
    for name, layout, d in examples:
        cloud = parse_cloud_placement(d["placement"])
        for i, where in enumerate(cloud.candidates()):
            rendered = render_domain(
                provider=d["provider"],
                fleet_slug=layout["slug"],
                domain_slug=d["slug"],
                placement=d["placement"],
                driver=d["driver"],
                candidate_index=i,
            )
            key = f"{name}#{i}"
            # The text is what `sky launch` reads: parse the YAML, not our dict.
            cases.append(
                {
                    "id": key,
                    "document": yaml.safe_load(rendered.text),
                    "secret_names": list(rendered.secret_names),
                }
            )
            expected[key] = (cloud, where, d)
    env = {
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", ""),
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
    }
    proc = subprocess.run(
        [str(python), str(ROOT / "tests" / "drivers" / "sky_parse.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    assert set(results) == set(expected)
    for key, (cloud, where, d) in expected.items():
        result = results[key]
        assert "error" not in result, (key, result.get("error"))
        f = result["fields"]
        assert f["cloud"].lower() == cloud.cloud, key
        assert f["region"] == where.region, key
        assert f["zone"] == where.zone, key
        assert f["accelerators"] == {cloud.accelerator: cloud.accelerator_count}, key
        assert f["use_spot"] is cloud.use_spot, key
        if cloud.disk_size_gb is not None:
            assert f["disk_size"] == cloud.disk_size_gb, key
        if cloud.image is not None:
            assert cloud.image in json.dumps(f["image_id"]), key
        driver = d["driver"]
        ports = {driver.get("supervisorPort", 8701)} | (
            {driver["servingPort"]} if "servingPort" in driver else set()
        )
        assert f["ports"] == sorted(ports), key
        assert {"HARU_SUPERVISOR_CONFIG", "HARU_SUPERVISOR_HOST", "PORT"} <= set(f["envs"]), key
        # The token and the supervisor's TLS certificate and key: secrets, never plain envs.
        assert not set(SECRET_NAMES) & set(f["envs"]), key
        assert f["secrets"] == sorted(SECRET_NAMES), key
        # Without --secret each is a managed reference: SkyPilot never saw a value.
        assert f["bare_inline_secrets"] == [], key
        assert f["bare_secret_refs"] == sorted(SECRET_NAMES), key
        assert f["run"].startswith("exec "), key
        if d["provider"] == "skyserve":
            assert f["service"] == {
                "readiness_path": driver.get("readinessPath", "/health"),
                "replicas": driver.get("replicas", 1),
                "ports": driver["servingPort"],
            }, key
