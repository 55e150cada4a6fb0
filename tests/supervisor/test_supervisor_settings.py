"""Environment variables and the bind rules: no token means loopback only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from supervisor.settings import SettingsError, is_loopback, settings_from_env

CONFIG = json.dumps(
    {"slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}]}
)


def test_defaults():
    s = settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG})
    assert (s.port, s.bind_host, s.token, s.log_level) == (8701, "127.0.0.1", None, "info")


def test_blank_values_count_as_unset():
    s = settings_from_env(
        {"HARU_SUPERVISOR_CONFIG": CONFIG, "PORT": " ", "HARU_SUPERVISOR_TOKEN": "  "}
    )
    assert s.port == 8701 and s.token is None


def test_port_must_be_a_port_number():
    for bad in ("http", "0", "70000", "-1"):
        with pytest.raises(SettingsError, match="PORT must be a port number"):
            settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG, "PORT": bad})


def test_config_is_required():
    with pytest.raises(SettingsError, match="HARU_SUPERVISOR_CONFIG is required"):
        settings_from_env({})


def test_non_loopback_bind_without_a_token_is_refused():
    with pytest.raises(SettingsError, match="refusing to listen on 0.0.0.0 without"):
        settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_HOST": "0.0.0.0"})


def test_non_loopback_bind_with_a_token_is_allowed():
    s = settings_from_env(
        {
            "HARU_SUPERVISOR_CONFIG": CONFIG,
            "HARU_SUPERVISOR_HOST": "0.0.0.0",
            "HARU_SUPERVISOR_TOKEN": "a-long-enough-token",
        }
    )
    assert s.bind_host == "0.0.0.0" and not s.token_is_weak


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gpu-host.internal", False),
    ],
)
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.integration
def test_process_refuses_a_public_bind_without_a_token(tools):
    env = tools.child_env(
        {"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_HOST": "0.0.0.0", "PORT": "1"}
    )
    result = subprocess.run(
        [sys.executable, "-m", "supervisor"],
        env=env,
        cwd=tools.repo_root,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without HARU_SUPERVISOR_TOKEN" in result.stderr


@pytest.mark.integration
def test_process_refuses_a_bad_config_naming_the_path(tools):
    bad = {"slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "Qwen", "port": 1}]}]}
    env = tools.child_env(
        {"HARU_SUPERVISOR_CONFIG": json.dumps(bad), "HARU_SUPERVISOR_TOKEN": "tok-0123456789abcdef"}
    )
    result = subprocess.run(
        [sys.executable, "-m", "supervisor"],
        env=env,
        cwd=tools.repo_root,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert "slots[0].models[0].name: must be lowercase" in result.stderr
    assert "tok-0123456789abcdef" not in result.stderr
