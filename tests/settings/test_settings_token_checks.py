"""A short or placeholder secret stops every command once HARU_API_TOKEN is set (haru.E004),
naming the variable and never printing the secret; in local development (no HARU_API_TOKEN) it
is a warning (haru.W001). The rule itself is common/secret_strength.py (issue 28)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.checks import run_checks

from common.loopback import is_loopback
from common.secret_strength import secret_weakness
from supervisor.settings import SettingsError, settings_from_env

ROOT = Path(__file__).resolve().parents[2]
GOOD = "Zq3v_8mKp2LxR7tWc9HbN4sYj6FgD1aE5uQ0oIeV"  # 40 characters, generated-looking
OTHER_GOOD = "p7Hc2Kq9LmX4vB8nT1sW6yR3dF5gJ0aZeUiOoQ_-"


@pytest.fixture
def secrets_set(monkeypatch):
    def set_secrets(**values: object) -> None:
        for key in ("api_token", "supervisor_token", "supervisor_master_key", "secret_key"):
            monkeypatch.setitem(settings.HARU, key, values.get(key))
        monkeypatch.setitem(settings.HARU, "chat_tokens", values.get("chat_tokens", []))

    return set_secrets


def found(level_id: str) -> list[str]:
    return [m.msg for m in run_checks() if m.id == level_id]


def test_with_an_operator_token_a_short_secret_is_an_error_naming_it(secrets_set):
    secrets_set(api_token=GOOD, supervisor_token="short-supervisor")
    errors = [m for m in run_checks() if m.id == "haru.E004"]
    assert [m.msg for m in errors] == ["HARU_SUPERVISOR_TOKEN is 16 characters; use at least 32"]
    assert all(m.is_serious() for m in errors)
    assert all("short-supervisor" not in (m.msg + (m.hint or "")) for m in errors)
    assert found("haru.W001") == []


def test_the_example_env_files_placeholders_are_errors(secrets_set):
    # deploy/haru.env.example's values, as an operator who forgot to edit them would run them.
    secrets_set(
        api_token="change-me-openssl-rand-hex-24-padded-out",
        supervisor_master_key="change-me",
        secret_key="CHANGE_ME_CHANGE_ME_CHANGE_ME_CHANGE_ME",
        chat_tokens=[OTHER_GOOD, "your-example-chat-token-0123456789abc"],
    )
    assert found("haru.E004") == [
        "HARU_API_TOKEN is a placeholder (it contains 'changeme'); replace it with a generated "
        "secret",
        "HARU_SUPERVISOR_MASTER_KEY is a placeholder (it contains 'changeme'); replace it with "
        "a generated secret",
        "HARU_SECRET_KEY is a placeholder (it contains 'changeme'); replace it with a generated "
        "secret",
        "HARU_CHAT_TOKENS item 2 is a placeholder (it contains 'example'); replace it with a "
        "generated secret",
    ]


def test_a_short_operator_token_names_itself(secrets_set):
    secrets_set(api_token="x")
    assert found("haru.E004") == ["HARU_API_TOKEN is 1 characters; use at least 32"]


def test_without_an_operator_token_a_weak_secret_is_only_warned_about(secrets_set):
    secrets_set(supervisor_master_key="short", secret_key="k" * 50)
    assert found("haru.E004") == []
    assert found("haru.W001") == [
        "HARU_SUPERVISOR_MASTER_KEY is 5 characters; use at least 32",
        "HARU_SECRET_KEY is a placeholder (1 distinct characters; a generated secret has at "
        "least 8)",
    ]


def test_generated_or_unset_secrets_raise_nothing(secrets_set):
    secrets_set(api_token=GOOD, supervisor_master_key=OTHER_GOOD, chat_tokens=[GOOD[::-1]])
    assert found("haru.E004") == [] and found("haru.W001") == []


@pytest.mark.parametrize(
    "secret",
    ["x" * 40, "ab" * 20, "change-me-" * 4, "Replace_Me-0123456789abcdefghijklmn", "a" * 31],
)
def test_the_rule_refuses_placeholders(secret):
    assert secret_weakness(secret) is not None


@pytest.mark.parametrize("seed", range(200))
def test_the_rule_accepts_what_the_hint_generates(seed):
    import secrets  # noqa: PLC0415 - the module the hint names

    assert secret_weakness(secrets.token_urlsafe(32)) is None
    assert secret_weakness(secrets.token_hex(16)) is None  # `openssl rand -hex 16`: 32 chars


def test_serve_refuses_to_start_with_a_placeholder_token(tmp_path):
    """The real command: system checks run before `serve` binds anything."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HARU_VAR_DIR": str(tmp_path / "var"),
        "HARU_API_TOKEN": GOOD,
        "HARU_SUPERVISOR_MASTER_KEY": "change-me",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "haru.E004" in result.stderr and "HARU_SUPERVISOR_MASTER_KEY" in result.stderr
    assert "haru serving" not in result.stdout


def example_secrets(name: str) -> dict[str, str]:
    """The credentials deploy/`name` sets, as an operator who copied it unedited would have."""
    text = (ROOT / "deploy" / name).read_text()
    return {
        var: value
        for var, value in (line.split("=", 1) for line in text.splitlines() if "=" in line)
        if not var.startswith("#") and var.endswith(("_TOKEN", "_TOKENS", "_KEY")) and value
    }


def test_the_example_env_files_secrets_do_not_start_unedited(secrets_set):
    """Issue 28: a forgotten edit of deploy/*.env.example must not run with a guessable secret."""
    control = example_secrets("haru.env.example")
    assert "HARU_API_TOKEN" in control
    names = {
        "HARU_API_TOKEN": "api_token",
        "HARU_SUPERVISOR_MASTER_KEY": "supervisor_master_key",
        "HARU_SUPERVISOR_TOKEN": "supervisor_token",
        "HARU_SECRET_KEY": "secret_key",
    }
    secrets_set(**{names[var]: value for var, value in control.items()})
    refused = found("haru.E004")
    assert sorted(m.split(" ", 1)[0] for m in refused) == sorted(control)
    assert not any(value in m for m in refused for value in control.values())


def test_the_example_supervisor_env_does_not_start_unedited():
    """supervisor.env.example binds 0.0.0.0: its placeholder token stops the supervisor."""
    text = (ROOT / "deploy" / "supervisor.env.example").read_text()
    environ = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#"
    )
    assert not is_loopback(environ["HARU_SUPERVISOR_HOST"])
    with pytest.raises(SettingsError, match="HARU_SUPERVISOR_TOKEN is a placeholder"):
        settings_from_env(environ)
