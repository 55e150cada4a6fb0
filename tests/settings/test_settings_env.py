"""Start-up configuration: every malformed environment variable stops the process by name.

Each case starts a real Python process with the variable set, because the contract is about
start-up (settings are read once at import), not about a helper function.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from haru import env

ROOT = Path(__file__).resolve().parents[2]

# Every variable the server reads; cleared so a developer's shell cannot leak into a case.
SERVER_VARS = (
    "DATABASE_URL",
    "REDIS_URL",
    "PORT",
    "HARU_API_TOKEN",
    "HARU_SUPERVISOR_TOKEN",
    "HARU_SUPERVISOR_MASTER_KEY",
    "HARU_SUPERVISOR_HOSTS",
    "HARU_SUPERVISOR_CA_BUNDLE",
    "HARU_CHAT_TOKENS",
    "HARU_DEFAULT_FLEET",
    "HARU_CHAT_HEADER_TIMEOUT_MS",
    "HARU_SNAPSHOT_CACHE_TTL_MS",
    "HARU_CHAT_MAX_BODY_BYTES",
    "HARU_CHAT_HOLD_MS",
    "HARU_CHAT_HOLD_MAX",
    "HARU_CHAT_HOLD_MAX_BYTES",
    "HARU_CHAT_HOLD_POLL_MS",
    "HARU_DRAIN_READY_MS",
    "HARU_DRAIN_BUDGET_MS",
    "HARU_RECONCILE_INTERVAL_MS",
    "HARU_RECONCILE_FLEETS",
    "HARU_FLEET_LAYOUT",
    "HARU_DEBUG",
    "HARU_ALLOWED_HOSTS",
    "HARU_SECRET_KEY",
)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Return an environment with none of the server's variables, plus `extra`."""
    base = {k: v for k, v in os.environ.items() if k not in SERVER_VARS}
    base.update(
        DJANGO_SETTINGS_MODULE="haru.settings",
        HARU_VAR_DIR=str(tmp_path / "var"),
        PYTHONPATH=str(ROOT),
    )
    base.update(extra)
    return base


def start_django(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=clean_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )


MALFORMED = [
    ("PORT", "abc", "PORT: must be an integer, got 'abc'"),
    ("PORT", "0", "PORT: must be between 1 and 65535, got 0"),
    ("PORT", "70000", "PORT: must be between 1 and 65535, got 70000"),
    ("DATABASE_URL", "mysql://u@db.example/haru", "DATABASE_URL: scheme must be one of"),
    ("DATABASE_URL", "postgres://db.example", "DATABASE_URL: must name a database"),
    ("DATABASE_URL", "postgres://db.example:port/haru", "DATABASE_URL: port must be a number"),
    ("REDIS_URL", "http://x", "REDIS_URL: scheme must be one of redis, rediss, got 'http'"),
    ("REDIS_URL", "redis://", "REDIS_URL: must name a host"),
    ("HARU_RECONCILE_INTERVAL_MS", "-1", "HARU_RECONCILE_INTERVAL_MS: must be between 100"),
    ("HARU_RECONCILE_INTERVAL_MS", "5s", "HARU_RECONCILE_INTERVAL_MS: must be an integer"),
    ("HARU_CHAT_MAX_BODY_BYTES", "0", "HARU_CHAT_MAX_BODY_BYTES: must be between 1"),
    ("HARU_CHAT_HEADER_TIMEOUT_MS", "1.5", "HARU_CHAT_HEADER_TIMEOUT_MS: must be an integer"),
    ("HARU_SNAPSHOT_CACHE_TTL_MS", "-3", "HARU_SNAPSHOT_CACHE_TTL_MS: must be between 0"),
    ("HARU_CHAT_HOLD_MS", "-1", "HARU_CHAT_HOLD_MS: must be between 0 and 600000"),
    ("HARU_CHAT_HOLD_MAX", "lots", "HARU_CHAT_HOLD_MAX: must be an integer"),
    ("HARU_CHAT_HOLD_POLL_MS", "20000", "HARU_CHAT_HOLD_POLL_MS: must be between 0 and 10000"),
    ("HARU_DRAIN_BUDGET_MS", "-5", "HARU_DRAIN_BUDGET_MS: must be between 0"),
    ("HARU_DEBUG", "maybe", "HARU_DEBUG: must be a boolean"),
    ("HARU_SUPERVISOR_HOSTS", "10.0.0.0/40", "HARU_SUPERVISOR_HOSTS: '10.0.0.0/40' is not a"),
    ("HARU_SUPERVISOR_HOSTS", "a b", "HARU_SUPERVISOR_HOSTS: 'a b' is not a host name pattern"),
    ("HARU_SUPERVISOR_CA_BUNDLE", "/no/such/ca.pem", "HARU_SUPERVISOR_CA_BUNDLE: no such file"),
]


@pytest.mark.parametrize(("name", "value", "message"), MALFORMED, ids=lambda v: str(v)[:40])
def test_malformed_variable_stops_startup_naming_it(tmp_path, name, value, message):
    result = start_django(tmp_path, **{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_malformed_variable_stops_manage_py_too(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=clean_env(tmp_path, PORT="eighty"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "PORT: must be an integer, got 'eighty'" in result.stderr


def test_database_password_never_appears_in_the_error(tmp_path):
    result = start_django(tmp_path, DATABASE_URL="mysql://haru:s3cret-pw@db.example/haru")
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr
    assert "s3cret-pw" not in result.stderr


def test_well_formed_environment_starts(tmp_path):
    result = start_django(
        tmp_path,
        PORT="8800",
        DATABASE_URL="postgres:///haru",  # local Unix socket: no host is fine
        REDIS_URL="redis://127.0.0.1:6379/3",
        HARU_RECONCILE_INTERVAL_MS="1000",
        HARU_CHAT_MAX_BODY_BYTES="1024",
        HARU_DEBUG="off",
        HARU_RECONCILE_FLEETS="demo, other ,",
    )
    assert result.returncode == 0, result.stderr


def test_blank_values_count_as_unset():
    assert env.integer("PORT", 8700, minimum=1, env={"PORT": "  "}) == 8700
    assert env.url("REDIS_URL", ("redis",), env={"REDIS_URL": ""}) is None
    assert env.csv("HARU_RECONCILE_FLEETS", env={"HARU_RECONCILE_FLEETS": " a, ,b "}) == ["a", "b"]


def test_redact_url_hides_the_password_only():
    assert env.redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert env.redact_url("postgres://u:pw@h/db") == "postgres://u:***@h/db"
    assert env.redact_url("postgres://u@h/db") == "postgres://u@h/db"


def test_hold_and_drain_defaults(tmp_path):
    """The names and defaults the proxy and the reconciler share (the poll bound above all)."""
    keys = ("chat_hold_ms", "chat_hold_max", "chat_hold_poll_ms", "drain_ready_ms")
    code = "import django; django.setup(); from django.conf import settings as s; print(*("
    code += ", ".join(f"s.HARU[{k!r}]" for k in keys + ("drain_budget_ms",))
    code += "))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == ["30000", "1000", "250", "1000", "15000"], result.stderr
