"""Web hardening that depends on start-up settings (issue 11, findings 8 and 10).

Each case starts a real Python process with the environment it names, because the defaults are
decided when the settings are read: ALLOWED_HOSTS without a token, and HARU_BEHIND_TLS.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.settings.test_settings_env import ROOT, clean_env

# Generated-looking: fleets/checks.py refuses a short or placeholder secret with a token set.
TOKEN = "hardening-token-0123456789abcdefghijklmn"
SECRET_KEY = "hardening-secret-key-0123456789abcdefghijklmnopqrstuvwxyzABCD"

# Asks the server, in-process, for /healthz under several Host names: Django's own check, and
# the ASGI guard in front of the chat proxy (which Django's check never sees).
PROBE = """
import asyncio, json, django
django.setup()
from django.conf import settings
from django.test import Client
import httpx
from haru.asgi import application

async def proxied(host):
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        response = await client.get("/v1/models", headers={"host": host})
        return response.status_code, response.json().get("error", {}).get("code")

hosts = ["localhost:8700", "127.0.0.1:8700", "[::1]:8700", "evil.example:8700", "haru.example.com"]
out = {"allowed": settings.ALLOWED_HOSTS}
for host in hosts:
    out[host] = [Client(HTTP_HOST=host).get("/healthz").status_code, *asyncio.run(proxied(host))]
print(json.dumps(out))
"""


def probe(tmp_path, **extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=clean_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_without_a_token_only_loopback_names_are_answered(tmp_path):
    out = probe(tmp_path)
    assert out["allowed"] == ["localhost", "127.0.0.1", "[::1]"]
    for host in ("localhost:8700", "127.0.0.1:8700", "[::1]:8700"):
        assert out[host][0] == 200, host
        assert out[host][2] != "invalid_host", host
    # A rebinding page's own name: refused by Django and by the guard in front of the proxy.
    for host in ("evil.example:8700", "haru.example.com"):
        assert out[host] == [400, 400, "invalid_host"], host


def test_with_a_token_every_name_is_answered_unless_listed(tmp_path):
    token = TOKEN
    out = probe(tmp_path, HARU_API_TOKEN=token)
    assert out["allowed"] == ["*"]
    assert out["evil.example:8700"][0] == 200
    out = probe(tmp_path, HARU_API_TOKEN=token, HARU_ALLOWED_HOSTS="haru.example.com")
    assert out["haru.example.com"][0] == 200
    assert out["evil.example:8700"] == [400, 400, "invalid_host"]


TLS_WARNINGS = ("security.W004", "security.W012", "security.W016")


def check_deploy(tmp_path, **extra: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=clean_env(tmp_path, HARU_SECRET_KEY=SECRET_KEY, HARU_API_TOKEN=TOKEN, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize("behind_tls", ["1", "0"])
def test_behind_tls_turns_on_secure_cookies_hsts_and_the_forwarded_scheme(tmp_path, behind_tls):
    report = check_deploy(tmp_path, HARU_BEHIND_TLS=behind_tls)
    for warning in TLS_WARNINGS:
        assert (warning in report) is (behind_tls == "0"), (warning, report)
    values = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, json; django.setup(); from django.conf import settings as s; "
            "print(json.dumps([s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
            "s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER]))",
        ],
        cwd=ROOT,
        env=clean_env(tmp_path, HARU_BEHIND_TLS=behind_tls),
        capture_output=True,
        text=True,
        timeout=120,
    )
    expected = (
        [True, True, 31536000, ["HTTP_X_FORWARDED_PROTO", "https"]]
        if behind_tls == "1"
        else [False, False, 0, None]
    )
    assert json.loads(values.stdout) == expected, values.stderr
