"""Environment variables and the bind rules: no token means loopback only."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from common.edge import limits as edge_limits
from common.loopback import is_loopback
from supervisor import server
from supervisor.api import MAX_BODY_BYTES as API_MAX_BODY_BYTES
from supervisor.settings import EDGE_SETTINGS, SettingsError, settings_from_env

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
            "HARU_SUPERVISOR_TOKEN": "a-long-enough-token-0123456789abcdef",
        }
    )
    assert s.bind_host == "0.0.0.0" and not s.token_is_weak


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("change-me-this-domains-token-xxxxxxx", "is a placeholder (it contains 'changeme')"),
        ("a-long-enough-token", "is 19 characters; use at least 32"),
    ],
)
def test_non_loopback_bind_with_a_placeholder_or_short_token_is_refused(token, reason):
    """deploy/supervisor.env.example's placeholder must not go live by being forgotten."""
    env = {"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_TOKEN": token}
    with pytest.raises(SettingsError) as refused:
        settings_from_env({**env, "HARU_SUPERVISOR_HOST": "0.0.0.0"})
    assert f"HARU_SUPERVISOR_TOKEN {reason}" in str(refused.value)
    assert token not in str(refused.value)
    # On loopback (local development) it starts, warned about (supervisor/server.py).
    assert settings_from_env(env).token_is_weak


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


# ---------------------------------------------------------------------------------------------
# The HTTP edge's settings (HARU_SUPERVISOR_HTTP_*)


def test_the_edge_has_bounded_defaults():
    edge = settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG}).edge
    assert edge == edge_limits.EdgeLimits(
        header_timeout_s=10.0,
        body_timeout_s=10.0,
        keepalive_timeout_s=5.0,
        max_header_bytes=16384,
        max_headers=64,
        max_body_bytes=1024 * 1024,
        max_connections=256,
        max_connections_per_address=128,
    )


def test_edge_settings_are_read_in_their_units():
    edge = settings_from_env(
        {
            "HARU_SUPERVISOR_CONFIG": CONFIG,
            "HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS": "1500",
            "HARU_SUPERVISOR_HTTP_BODY_TIMEOUT_MS": " 2500 ",
            "HARU_SUPERVISOR_HTTP_KEEPALIVE_TIMEOUT_MS": "750",
            "HARU_SUPERVISOR_HTTP_MAX_HEADER_BYTES": "8192",
            "HARU_SUPERVISOR_HTTP_MAX_HEADERS": "32",
            "HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES": "131072",
            "HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS": "64",
            "HARU_SUPERVISOR_HTTP_MAX_HEADERS_UNRELATED": "x",  # not a setting: ignored
        }
    ).edge
    assert (edge.header_timeout_s, edge.body_timeout_s, edge.keepalive_timeout_s) == (
        1.5,
        2.5,
        0.75,
    )
    assert (edge.max_header_bytes, edge.max_headers) == (8192, 32)
    assert (edge.max_body_bytes, edge.max_connections) == (131072, 64)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS", "0"),
        ("HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS", "1.5"),
        ("HARU_SUPERVISOR_HTTP_BODY_TIMEOUT_MS", "-1"),
        ("HARU_SUPERVISOR_HTTP_KEEPALIVE_TIMEOUT_MS", "5s"),
        ("HARU_SUPERVISOR_HTTP_MAX_HEADER_BYTES", "100"),
        ("HARU_SUPERVISOR_HTTP_MAX_HEADERS", "many"),
        ("HARU_SUPERVISOR_HTTP_MAX_HEADERS", "1"),
        ("HARU_SUPERVISOR_HTTP_MAX_BODY_BYTES", "1000"),
        ("HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS", "1"),
        ("HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS", "١٠٠"),  # Arabic-Indic digits: not a number here
    ],
)
def test_a_bad_edge_value_is_refused_naming_the_variable_and_its_range(name, value):
    _, _, low, high = next(spec for spec in EDGE_SETTINGS.values() if spec[0] == name)
    with pytest.raises(SettingsError) as refused:
        settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG, name: value})
    assert str(refused.value) == f"{name} must be an integer from {low} to {high}, got {value!r}"


def test_the_edge_body_cap_cannot_go_below_the_apis_own():
    # Below it, the edge's coarser 413 would pre-empt the API's on an honest control body.
    assert EDGE_SETTINGS["max_body_bytes"][2] == API_MAX_BODY_BYTES


def test_main_refuses_a_bad_edge_value_before_binding(capsys):
    environ = {"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_HTTP_MAX_HEADERS": "lots"}
    assert server.main(environ) == 2
    assert "HARU_SUPERVISOR_HTTP_MAX_HEADERS must be an integer" in capsys.readouterr().err


def test_a_connection_cap_the_open_file_limit_cannot_hold_is_lowered_naming_its_variable(
    monkeypatch, caplog
):
    monkeypatch.setattr(edge_limits.resource, "getrlimit", lambda which: (1024, 1024))
    monkeypatch.setattr(edge_limits.resource, "setrlimit", lambda which, pair: None)
    limits = settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG}).edge
    wanted = edge_limits.EdgeLimits(**{**limits.__dict__, "max_connections": 4096})
    with caplog.at_level(logging.WARNING):
        protocol = server.edge_protocol(wanted)
    assert protocol.LIMITS is not None
    assert protocol.LIMITS.max_connections == (1024 - 256) // 2
    assert "HARU_SUPERVISOR_HTTP_MAX_CONNECTIONS=4096 needs" in caplog.text
