"""A real supervisor process serving HTTPS (HARU_SUPERVISOR_TLS_CERT/_KEY), called by the control
plane's client with its derived token: verified with HARU_SUPERVISOR_CA_BUNDLE, refused without."""

from __future__ import annotations

import json
import ssl
import sys
import uuid

import httpx
import pytest
import trustme

from fleets.core.credentials import derive_supervisor_token
from fleets.reconciler.supervisor import client
from supervisor.settings import SettingsError, settings_from_env

MASTER = "master-key-for-tests-0123456789abcdefghij"
DOMAIN = uuid.UUID("0b6c1f4e-6a8f-4d55-9a0e-1b2c3d4e5f60")


@pytest.mark.integration
def test_a_supervisor_serves_https_to_a_client_holding_the_ca(
    processes, tools, tmp_path, settings, real_transport
):
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert_path, key_path, bundle = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(bundle))
    token = derive_supervisor_token(MASTER, DOMAIN)
    port = tools.free_port()
    config = {
        "gpu": {"backend": "sim", "simStateFile": str(tmp_path / "gpu.json")},
        "stateDir": str(tmp_path / "state"),
        "slots": [{"kind": "inference", "gpuIndex": 0, "models": [{"name": "m", "port": 9}]}],
    }
    env = tools.child_env(
        {
            "PORT": str(port),
            "HARU_SUPERVISOR_CONFIG": json.dumps(config),
            "HARU_SUPERVISOR_TOKEN": token,
            "HARU_SUPERVISOR_TLS_CERT": str(cert_path),
            "HARU_SUPERVISOR_TLS_KEY": str(key_path),
        }
    )
    processes.start([sys.executable, "-m", "supervisor"], env=env)
    url = f"https://localhost:{port}"
    trusted = ssl.create_default_context(cafile=str(bundle))
    tools.wait_for(
        lambda: httpx.get(f"{url}/healthz", verify=trusted, timeout=1).status_code == 200,
        timeout=15,
    )

    settings.HARU = {**settings.HARU, "supervisor_ca_bundle": str(bundle)}
    verified = client.SupervisorClient(url, token=token).status(timeout=5.0)
    assert verified.ok, verified.error
    assert verified.value.slots[0].models[0].name == "m"

    settings.HARU = {**settings.HARU, "supervisor_ca_bundle": None}
    refused = client.SupervisorClient(url, token=token).status(timeout=5.0)
    assert refused.error is not None and "CERTIFICATE_VERIFY_FAILED" in refused.error.message
    # Plain HTTP to the TLS port gets nothing useful either.
    plain = client.SupervisorClient(f"http://localhost:{port}", token=token).status(timeout=5.0)
    assert not plain.ok


def test_tls_settings_go_together_and_must_exist(tmp_path):
    base = {"HARU_SUPERVISOR_CONFIG": "{}"}
    with pytest.raises(SettingsError, match="go together"):
        settings_from_env({**base, "HARU_SUPERVISOR_TLS_CERT": str(tmp_path / "c.pem")})
    with pytest.raises(SettingsError, match="HARU_SUPERVISOR_TLS_CERT: no such file"):
        settings_from_env(
            {
                **base,
                "HARU_SUPERVISOR_TLS_CERT": str(tmp_path / "c.pem"),
                "HARU_SUPERVISOR_TLS_KEY": str(tmp_path / "k.pem"),
            }
        )
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    s = settings_from_env(
        {
            **base,
            "HARU_SUPERVISOR_TLS_CERT": str(tmp_path / "c.pem"),
            "HARU_SUPERVISOR_TLS_KEY": str(tmp_path / "k.pem"),
        }
    )
    assert (s.tls_cert, s.tls_key) == (str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
