"""The server-edge, database-pool and request-deadline settings: defaults, overrides, refusals,
as read at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "d = s.DATABASES['default']; o = {k: v for k, v in d.get('OPTIONS', {}).items()}; "
    "print(json.dumps({'haru': {k: v for k, v in s.HARU.items() if k.startswith(('http_', "
    "'db_'))}, 'engine': d['ENGINE'], 'max_age': d.get('CONN_MAX_AGE'), "
    "'options': o, 'middleware': s.MIDDLEWARE[0]}, "
    "default=lambda c: f'{c.__module__}.{c.__qualname__}'))"
)


def settings_with(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARU_", "DATABASE_URL"))}
    env.update(DJANGO_SETTINGS_MODULE="haru.settings", HARU_VAR_DIR=str(tmp_path / "var"))
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def read(tmp_path: Path, **extra: str) -> dict:
    result = settings_with(tmp_path, **extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_safe_defaults(tmp_path):
    haru = read(tmp_path)["haru"]
    assert haru == {
        "http_header_timeout_ms": 10000,
        "http_body_timeout_ms": 60000,
        "http_keepalive_timeout_ms": 5000,
        "http_max_header_bytes": 65536,
        "http_max_headers": 100,
        "http_max_connections": 2048,
        "http_max_connections_per_address": 256,
        # The chat proxy's cap (32 MiB) plus 1 MiB: chat keeps its own, finer 413.
        "http_max_body_bytes": 33 * 1024 * 1024,
        "db_pool_max": 20,
        "db_pool_timeout_ms": 5000,
        "db_request_deadline_ms": 5000,
        "db_prepared_statements": True,
    }


def test_postgres_gets_a_pool_and_no_persistent_connections(tmp_path):
    got = read(
        tmp_path,
        DATABASE_URL="postgres://u@db.invalid:5432/haru",
        HARU_DB_POOL_MAX="7",
        HARU_DB_POOL_TIMEOUT_MS="2500",
    )
    assert got["max_age"] == 0
    assert got["options"]["pool"] == {
        "min_size": 2,
        "max_size": 7,
        "timeout": 2.5,
        "max_idle": 60,
        "connection_class": "haru.postgres.deadline.DeadlineConnection",
    }
    assert got["options"]["connect_timeout"] == 2


def test_postgres_runs_on_the_backend_with_the_request_deadline(tmp_path):
    got = read(
        tmp_path,
        DATABASE_URL="postgres://u@db.invalid:5432/haru",
        HARU_DB_REQUEST_DEADLINE_MS="1500",
    )
    assert got["engine"] == "haru.postgres"
    assert got["haru"]["db_request_deadline_ms"] == 1500
    # First, so the session and user reads of every request are inside the deadline.
    assert got["middleware"] == "haru.postgres.middleware.RequestDeadlineMiddleware"


def test_postgres_prepares_the_ticks_statements_unless_told_not_to(tmp_path):
    # Only fleets/base/prepared.py's server-binding cursor prepares; Django's own cursors bind
    # on the client and never do, whatever the threshold.
    url = "postgres://u@db.invalid:5432/haru"
    assert read(tmp_path, DATABASE_URL=url)["options"]["prepare_threshold"] == 5
    off = read(tmp_path, DATABASE_URL=url, HARU_DB_PREPARED_STATEMENTS="false")
    assert off["options"]["prepare_threshold"] is None


def test_a_connect_timeout_in_the_url_wins(tmp_path):
    got = read(tmp_path, DATABASE_URL="postgres://u@db.invalid:5432/haru?connect_timeout=7")
    assert got["options"]["connect_timeout"] == 7


def test_sqlite_has_no_pool(tmp_path):
    got = read(tmp_path)
    assert got["engine"] == "django.db.backends.sqlite3"
    assert "pool" not in got["options"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HARU_HTTP_HEADER_TIMEOUT_MS", "0"),
        ("HARU_HTTP_MAX_HEADER_BYTES", "100"),
        ("HARU_HTTP_MAX_HEADERS", "many"),
        ("HARU_HTTP_MAX_CONNECTIONS", "1"),
        ("HARU_HTTP_MAX_BODY_BYTES", "1000"),
        ("HARU_HTTP_MAX_BODY_BYTES", "lots"),
        ("HARU_DB_POOL_MAX", "1"),
        ("HARU_DB_POOL_TIMEOUT_MS", "-5"),
        ("HARU_DB_PREPARED_STATEMENTS", "sometimes"),
        ("HARU_DB_REQUEST_DEADLINE_MS", "0"),
        ("HARU_DB_REQUEST_DEADLINE_MS", "99"),
        ("HARU_DB_REQUEST_DEADLINE_MS", "5s"),
        ("HARU_DB_REQUEST_DEADLINE_MS", "600001"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path, name, value):
    result = settings_with(tmp_path, **{name: value})
    assert result.returncode != 0
    assert name in result.stderr


def test_the_body_cap_follows_the_chat_cap_by_default(tmp_path):
    haru = read(tmp_path, HARU_CHAT_MAX_BODY_BYTES=str(100 * 1024 * 1024))["haru"]
    assert haru["http_max_body_bytes"] == 101 * 1024 * 1024


def test_a_body_cap_may_be_set_at_or_above_the_chat_cap(tmp_path):
    haru = read(tmp_path, HARU_CHAT_MAX_BODY_BYTES="2097152", HARU_HTTP_MAX_BODY_BYTES="2097152")[
        "haru"
    ]
    assert haru["http_max_body_bytes"] == 2097152


def test_a_body_cap_below_the_chat_cap_stops_start_up(tmp_path):
    result = settings_with(
        tmp_path, HARU_CHAT_MAX_BODY_BYTES="4194304", HARU_HTTP_MAX_BODY_BYTES="2097152"
    )
    assert result.returncode != 0
    assert "HARU_HTTP_MAX_BODY_BYTES: must be at least HARU_CHAT_MAX_BODY_BYTES" in result.stderr
