"""deploy/: systemd units that systemd itself accepts, hardened; a bounded reverse proxy; and
only declared settings, each in the environment file of the process that reads it."""

from __future__ import annotations

import configparser
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

from common.setting import declared
from fleets.base.setting_table import HaruSettings
from supervisor.settings import SupervisorSettings
from tests.deploy import real_tools
from tests.deploy.real_tools import require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
VENV_BIN = "/opt/haru/venv/bin/"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_there_is_a_unit_for_each_process():
    assert [u.name for u in UNITS] == [
        "haru-beat.service",
        "haru-metrics.service",
        "haru-server.service",
        "haru-supervisor.service",
        "haru-worker.service",
    ]


def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    analyze = require("systemd-analyze")
    # The units pointed at the venv this test run uses (CI's own build), in place of
    # /opt/haru/venv: verify insists that every ExecStart binary exists and is executable.
    venv_bin = Path(sysconfig.get_path("scripts"))
    for name in ("python", "celery", "django-admin"):
        assert (venv_bin / name).is_file(), f"{venv_bin / name}: the venv lacks it"
    copies = []
    for unit in UNITS:
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace(VENV_BIN, f"{venv_bin}/"))
        copies.append(str(copy))
    result = subprocess.run(
        [analyze, "verify", *copies], capture_output=True, text=True, timeout=60, check=False
    )
    # Unknown or misspelt keys are only warnings (exit 0): any output at all is a failure.
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).strip() == ""


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.stem)
def test_every_unit_runs_unprivileged_hardened_and_restarts(unit):
    service = _unit(unit)["Service"]
    assert service["User"] == "haru"
    assert service["EnvironmentFile"].startswith("/etc/haru/")
    assert service["Restart"] in ("always", "on-failure")
    assert service["ExecStart"].startswith(VENV_BIN)
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == value, f"{unit.name}: {key}"


def test_the_supervisor_leaves_its_model_servers_running_when_it_restarts():
    # They are adopted by the next supervisor; killing the cgroup would drop the active's traffic.
    assert _unit(DEPLOY / "systemd" / "haru-supervisor.service")["Service"]["KillMode"] == "process"


def test_the_reverse_proxy_bounds_headers_bodies_and_streams_chat():
    conf = (DEPLOY / "nginx" / "haru.conf").read_text()
    for directive in (
        "client_header_timeout",
        "client_body_timeout",
        "client_max_body_size",
        "large_client_header_buffers",
        "limit_conn_zone $binary_remote_addr",
        "limit_conn ",
        "proxy_buffering off",
        "proxy_read_timeout",
    ):
        assert directive in conf, directive


def test_the_example_environment_names_only_variables_haru_reads():
    """Each file sets (or leaves commented out) only what its process declares."""
    for name, table in (
        ("haru.env.example", HaruSettings),
        ("supervisor.env.example", SupervisorSettings),
    ):
        assigned = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", (DEPLOY / name).read_text(), re.M))
        assert assigned, name
        assert assigned - {s.env for s in declared(table)} == set(), name


def test_the_units_set_only_declared_settings():
    # Besides Django's own DJANGO_SETTINGS_MODULE and CUDA's device order.
    known = {s.env for t in (HaruSettings, SupervisorSettings) for s in declared(t)}
    known |= {"DJANGO_SETTINGS_MODULE", "CUDA_DEVICE_ORDER"}
    for unit in UNITS:
        assigned = set(re.findall(r"^Environment=([A-Z0-9_]+)=", unit.read_text(), re.M))
        assert assigned - known == set(), unit.name


def test_every_haru_name_in_deploy_is_declared():
    known = {s.env for t in (HaruSettings, SupervisorSettings) for s in declared(t)}
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix in {".example", ".service", ".conf", ".md"}:
            named = set(re.findall(r"(?<![A-Za-z0-9_])HARU_[A-Z0-9_]+", path.read_text()))
            assert named - known == set(), path.relative_to(ROOT)


def test_a_missing_tool_skips_by_default_and_fails_where_ci_requires_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(real_tools.shutil, "which", lambda *a, **k: None)
    monkeypatch.delenv(real_tools.REQUIRED_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install nginx-light"):
        real_tools.require("nginx")
    monkeypatch.setenv(real_tools.REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="HARU_DEPLOY_TOOLS_REQUIRED=1.*promtool"):
        real_tools.require("promtool")
