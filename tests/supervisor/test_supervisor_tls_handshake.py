"""A real supervisor serving HTTPS closes a connection whose TLS handshake is not done by the
edge's header deadline (HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS), whether its client sent
nothing or half a ClientHello, and still serves a client that completes its handshake.

Without the bound, asyncio's default handshake deadline (60 s) applies: the reads below, which
wait at most WAIT_S, would time out instead of seeing the connection closed."""

from __future__ import annotations

import json
import socket
import ssl
import sys

import httpx
import pytest
import trustme

TOKEN = "handshake-deadline-token-0123456789abcdefXYZ"
HEADER_TIMEOUT_MS = 1000
# Far under asyncio's 60 s default, far over the 1 s deadline.
WAIT_S = 15.0
# A TLS record header (handshake, TLS 1.0 record version, 512 bytes announced) and the start of
# a ClientHello: the server waits for the rest of the record.
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + b"\x00" * 16


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes (True) or WAIT_S passes with the connection open (False)."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(4096):
            pass  # an alert, if the server sends one before closing
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


@pytest.fixture
def https_supervisor(processes, tools, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path, bundle = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(bundle))
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
            "HARU_SUPERVISOR_TOKEN": TOKEN,
            "HARU_SUPERVISOR_TLS_CERT": str(cert_path),
            "HARU_SUPERVISOR_TLS_KEY": str(key_path),
            "HARU_SUPERVISOR_HTTP_HEADER_TIMEOUT_MS": str(HEADER_TIMEOUT_MS),
        }
    )
    processes.start([sys.executable, "-m", "supervisor"], env=env)
    trusted = ssl.create_default_context(cafile=str(bundle))
    url = f"https://127.0.0.1:{port}"
    tools.wait_for(
        lambda: httpx.get(f"{url}/healthz", verify=trusted, timeout=1).status_code == 200,
        timeout=15,
    )
    return port, url, trusted


@pytest.mark.integration
def test_a_handshake_not_done_by_the_header_deadline_is_closed(https_supervisor):
    port, url, trusted = https_supervisor
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    partial = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        partial.sendall(PARTIAL_CLIENT_HELLO)
        closed = {"no ClientHello": _closed_by_server(silent), "half": _closed_by_server(partial)}
    finally:
        silent.close()
        partial.close()
    assert closed == {"no ClientHello": True, "half": True}
    # A client that completes its handshake is served as before.
    assert httpx.get(f"{url}/healthz", verify=trusted, timeout=5).status_code == 200
