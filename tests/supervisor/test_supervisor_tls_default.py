"""HTTPS by default beyond loopback: a real supervisor bound to 0.0.0.0 with no certificate
serves a self-signed one it made in its state dir, `python -m supervisor tls-fingerprint` prints
its pin, and the control plane's client reaches it with that pin and refuses it with another.
Loopback stays plain HTTP; plain HTTP beyond loopback only by the name `plain-http`."""

from __future__ import annotations

import json
import logging
import os
import ssl
import stat
import subprocess
import sys
import time

import httpx
import pytest

from common.tls_identity import generate
from common.tls_pin import fingerprint_of_pem
from fleets.reconciler.supervisor import client, transport
from supervisor import server
from supervisor.engines.launch import inherited_env
from supervisor.settings import SettingsError, settings_from_env
from supervisor.tls import CERT_NAME, KEY_NAME, TLS_DIR, server_tls

TOKEN = "tls-default-token-0123456789abcdefXYZ"
CONFIG = json.dumps(
    {"slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}]}
)
PUBLIC = {"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_HOST": "0.0.0.0"}
PUBLIC_WITH_TOKEN = {**PUBLIC, "HARU_SUPERVISOR_TOKEN": TOKEN}
OTHER_PIN = "sha256:" + "ab" * 32


def _host_env(tools, tmp_path, port: int, **extra: str) -> dict[str, str]:
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "gpu.json")},
        "stateDir": str(tmp_path / "state"),
        "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}],
    }
    return tools.child_env(
        {
            "PORT": str(port),
            "HARU_SUPERVISOR_CONFIG": json.dumps(config),
            "HARU_SUPERVISOR_HOST": "0.0.0.0",
            "HARU_SUPERVISOR_TOKEN": TOKEN,
            **extra,
        }
    )


def _fingerprint_command(tools, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "tls-fingerprint"],
        env=env,
        cwd=tools.repo_root,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _served_fingerprint(port: int) -> str:
    """The pin of what the server presents, read with an unverifying client."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), timeout=5)
    return fingerprint_of_pem(pem.encode())


@pytest.mark.integration
def test_a_public_supervisor_serves_self_signed_https_the_pin_reaches_and_another_is_refused(
    processes, tools, tmp_path, real_transport
):
    port = tools.free_port()
    env = _host_env(tools, tmp_path, port)
    # The operator asks for the fingerprint before the first start: the identity is made then,
    # and the supervisor serves that same one.
    printed = _fingerprint_command(tools, env)
    assert printed.returncode == 0, printed.stderr
    pin = printed.stdout.strip()
    assert pin.startswith("sha256:") and len(pin) == 71
    key = tmp_path / "state" / TLS_DIR / KEY_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "PRIVATE KEY" not in printed.stdout + printed.stderr

    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        processes.start([sys.executable, "-m", "supervisor"], env=env, stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    tools.wait_for(lambda: httpx.get(f"{url}/healthz", verify=False, timeout=1).is_success, 20)
    assert _served_fingerprint(port) == pin
    # Plain HTTP to the same port gets nothing.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)

    pinned = client.SupervisorClient(url, token=TOKEN, tls=transport.TlsTrust(pin=pin, domain="d"))
    ok = pinned.status(timeout=5.0)
    assert ok.ok, ok.error
    assert ok.value.slots[0].models[0].name == "m"

    wrong = client.SupervisorClient(
        url, token=TOKEN, tls=transport.TlsTrust(pin=OTHER_PIN, domain="east")
    ).status(timeout=5.0)
    assert wrong.error is not None and wrong.error.kind == transport.NETWORK
    message = wrong.error.message
    assert "TLS certificate refused for domain east" in message
    assert pin in message and OTHER_PIN in message
    assert TOKEN not in message

    # Without a pin or a CA that signed it, a self-signed certificate is not trusted.
    unpinned = client.SupervisorClient(url, token=TOKEN).status(timeout=5.0)
    assert unpinned.error is not None and "CERTIFICATE_VERIFY_FAILED" in unpinned.error.message

    # The start-up log names the pin, never the key.
    logged = log_path.read_text()
    assert f"fingerprint {pin}" in logged and "on https://0.0.0.0" in logged
    assert "PRIVATE KEY" not in logged and key.read_text().splitlines()[1] not in logged


@pytest.mark.integration
def test_a_restart_keeps_the_self_signed_identity(tmp_path):
    settings = settings_from_env(PUBLIC_WITH_TOKEN)
    first = server_tls(settings, tmp_path, ["gpu-a.internal"])
    again = server_tls(settings, tmp_path, ["gpu-a.internal"])
    assert first is not None and again is not None
    assert first.fingerprint == again.fingerprint
    cert = (tmp_path / TLS_DIR / CERT_NAME).read_bytes()
    assert fingerprint_of_pem(cert) == first.fingerprint
    # Deleting the folder is how it is remade (and the pin must then be updated).
    for name in (CERT_NAME, KEY_NAME):
        (tmp_path / TLS_DIR / name).unlink()
    remade = server_tls(settings, tmp_path, [])
    assert remade is not None and remade.fingerprint != first.fingerprint


def test_loopback_stays_plain_http_by_default(tmp_path):
    settings = settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG})
    assert not settings.serves_tls
    assert server_tls(settings, tmp_path, []) is None
    assert not (tmp_path / TLS_DIR).exists()
    # ... unless asked for: `on` serves HTTPS on loopback too.
    on = settings_from_env({"HARU_SUPERVISOR_CONFIG": CONFIG, "HARU_SUPERVISOR_TLS": "on"})
    assert on.serves_tls and server_tls(on, tmp_path, []) is not None


def test_beyond_loopback_plain_http_only_by_name():
    assert settings_from_env(PUBLIC_WITH_TOKEN).serves_tls
    for vague in ("off", "false", "no", "0", "http"):
        with pytest.raises(SettingsError, match="'plain-http', by that name"):
            settings_from_env({**PUBLIC_WITH_TOKEN, "HARU_SUPERVISOR_TLS": vague})
    plain = settings_from_env({**PUBLIC_WITH_TOKEN, "HARU_SUPERVISOR_TLS": "plain-http"})
    assert not plain.serves_tls


def test_plain_http_beyond_loopback_is_warned_about(caplog):
    plain = settings_from_env({**PUBLIC_WITH_TOKEN, "HARU_SUPERVISOR_TLS": "plain-http"})
    with caplog.at_level(logging.WARNING, logger="supervisor"):
        server.log_exposure(plain, None)
    assert "PLAIN HTTP beyond loopback" in caplog.text


def test_a_certificate_with_plain_http_is_a_contradiction(tmp_path):
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    files = {"HARU_SUPERVISOR_TLS_CERT": str(tmp_path / "c.pem")}
    files["HARU_SUPERVISOR_TLS_KEY"] = str(tmp_path / "k.pem")
    with pytest.raises(SettingsError, match="plain-http and a certificate"):
        settings_from_env({**PUBLIC_WITH_TOKEN, **files, "HARU_SUPERVISOR_TLS": "plain-http"})
    identity = generate(["h"])
    pem = {
        "HARU_SUPERVISOR_TLS_CERT_PEM": identity.cert_pem.decode(),
        "HARU_SUPERVISOR_TLS_KEY_PEM": identity.key_pem.decode(),
    }
    with pytest.raises(SettingsError, match="both give a certificate"):
        settings_from_env({**PUBLIC_WITH_TOKEN, **files, **pem})
    with pytest.raises(SettingsError, match="go together"):
        settings_from_env({**PUBLIC_WITH_TOKEN, "HARU_SUPERVISOR_TLS_KEY_PEM": "k"})


def test_a_state_dir_it_cannot_write_stops_the_start_rather_than_serving_plain(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a state dir below a file: no certificate can be made there
    with pytest.raises(SettingsError, match="cannot serve HTTPS"):
        server_tls(settings_from_env(PUBLIC_WITH_TOKEN), blocker / "state", [])


def test_a_provisioned_identity_is_served_and_its_key_not_left_on_disk(tmp_path):
    identity = generate(["haru-prov-west"])
    settings = settings_from_env(
        {
            **PUBLIC_WITH_TOKEN,
            "HARU_SUPERVISOR_TLS_CERT_PEM": identity.cert_pem.decode(),
            "HARU_SUPERVISOR_TLS_KEY_PEM": identity.key_pem.decode(),
        }
    )
    assert identity.key_pem.decode() not in repr(settings)
    tls = server_tls(settings, tmp_path, [])
    assert tls is not None and tls.fingerprint == identity.fingerprint
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []


def test_a_bad_provisioned_key_names_no_secret(tmp_path):
    identity = generate(["h"])
    other = generate(["h"])
    settings = settings_from_env(
        {
            **PUBLIC_WITH_TOKEN,
            "HARU_SUPERVISOR_TLS_CERT_PEM": identity.cert_pem.decode(),
            "HARU_SUPERVISOR_TLS_KEY_PEM": other.key_pem.decode(),  # not the certificate's
        }
    )
    with pytest.raises(SettingsError, match="cannot serve HTTPS") as caught:
        server_tls(settings, tmp_path, [])
    assert "PRIVATE KEY" not in str(caught.value)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.integration
def test_the_fingerprint_command_says_when_nothing_is_served_over_tls(tools, tmp_path):
    env = tools.child_env({"HARU_SUPERVISOR_CONFIG": CONFIG, "PORT": str(tools.free_port())})
    result = _fingerprint_command(tools, env)
    assert result.returncode == 1
    assert "serves plain HTTP on 127.0.0.1" in result.stderr


@pytest.mark.integration
def test_the_process_refuses_a_vague_plain_http_beyond_loopback(tools, tmp_path):
    env = _host_env(tools, tmp_path, tools.free_port(), HARU_SUPERVISOR_TLS="off")
    result = subprocess.run(
        [sys.executable, "-m", "supervisor"],
        env=env,
        cwd=tools.repo_root,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "HARU_SUPERVISOR_TLS must be auto, on, plain-http, got 'off'" in result.stderr
    assert TOKEN not in result.stderr
    assert not (tmp_path / "state" / TLS_DIR).exists()


def test_the_provisioned_key_never_reaches_a_child():
    identity = generate(["h"])
    environ = {
        "PATH": "/usr/bin",
        "HARU_SUPERVISOR_TLS_KEY_PEM": identity.key_pem.decode(),
        "HARU_SUPERVISOR_TLS_CERT_PEM": identity.cert_pem.decode(),
    }
    inherited = inherited_env(environ)
    assert "HARU_SUPERVISOR_TLS_KEY_PEM" not in inherited
    assert identity.key_pem.decode() not in "".join(inherited.values())


def test_a_killed_makers_private_folder_is_removed_at_the_next_start(tmp_path):
    left = tmp_path / ".tls-abc123"
    left.mkdir(mode=0o700)
    (left / KEY_NAME).write_text("a key a killed supervisor was loading")
    fresh = tmp_path / ".tls-new-def456"  # a maker running right now
    fresh.mkdir(mode=0o700)
    old = time.time() - 3600
    os.utime(left, (old, old))
    assert server_tls(settings_from_env(PUBLIC_WITH_TOKEN), tmp_path, []) is not None
    assert not left.exists() and fresh.exists()
