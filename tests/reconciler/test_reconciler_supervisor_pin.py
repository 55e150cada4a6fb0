"""A pinned supervisor: a real TLS server on loopback with a self-signed certificate; the
control plane's own transport reaches it only while the certificate's SHA-256 is the domain's
pin, refuses any other before a byte of the request (and so the token) is sent, and never calls
an http:// supervisor beyond loopback unless the domain says plain-http."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.tls_identity import generate
from common.tls_pin import TlsIdentity
from fleets.core.model_health import Reach
from fleets.core.supervisor_tls import normal_pin
from fleets.models import Domain
from fleets.reconciler.supervisor import client, transport
from tests.reconciler.tls_status_server import StatusHandler, serving

pytestmark = pytest.mark.integration

TOKEN = "pin-test-token-0123456789abcdefGHIJ"


def _serve(identity: TlsIdentity, folder: Path) -> Iterator[str]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(identity.cert_pem)
    key.write_bytes(identity.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    with serving(context) as url:
        yield url


@pytest.fixture
def identity() -> TlsIdentity:
    return generate(["127.0.0.1"])


@pytest.fixture
def pinned_supervisor(identity, tmp_path) -> Iterator[str]:
    yield from _serve(identity, tmp_path)


def _status(url: str, pin: str, domain: str = "gpu-a") -> transport.Call:
    trust = transport.TlsTrust(pin=pin, domain=domain)
    return client.SupervisorClient(url, token=TOKEN, tls=trust).status(timeout=5.0)


def test_the_pinned_certificate_is_reached(pinned_supervisor, identity, real_transport):
    result = _status(pinned_supervisor, identity.fingerprint)
    assert result.ok, result.error
    assert result.value.slots[0].models[0].name == "llama-small"
    assert StatusHandler.seen == [f"Bearer {TOKEN}"]


def test_another_certificate_is_refused_naming_the_domain_before_the_token_is_sent(
    pinned_supervisor, identity, real_transport
):
    other = generate(["127.0.0.1"]).fingerprint
    result = _status(pinned_supervisor, other, domain="gpu-b")
    assert result.error is not None and result.error.kind == transport.NETWORK
    message = result.error.message
    assert message.startswith(f"GET {pinned_supervisor}/v1/status: TLS certificate refused")
    assert "for domain gpu-b" in message
    assert f"presented {identity.fingerprint}, not the pinned {other}" in message
    assert TOKEN not in message and "PRIVATE" not in message
    assert StatusHandler.seen == []  # refused after the handshake, before any request
    assert transport.call_reach(result) is not Reach.REFUSED  # not a dead process


def test_a_pin_in_openssls_form_is_the_same_pin(pinned_supervisor, identity, real_transport):
    hexdigits = identity.fingerprint.removeprefix("sha256:").upper()
    openssl = ":".join(hexdigits[i : i + 2] for i in range(0, 64, 2))
    assert _status(pinned_supervisor, normal_pin(openssl)).ok


def test_a_pinned_pool_never_serves_an_unpinned_call(pinned_supervisor, identity, real_transport):
    assert _status(pinned_supervisor, identity.fingerprint).ok
    # The same URL without a pin is verified against CAs, on a pool of its own: the self-signed
    # certificate is refused there, whatever the pinned pool holds open.
    unpinned = client.SupervisorClient(pinned_supervisor, token=TOKEN).status(timeout=5.0)
    assert unpinned.error is not None and "CERTIFICATE_VERIFY_FAILED" in unpinned.error.message
    assert StatusHandler.seen == [f"Bearer {TOKEN}"]


def test_a_remade_certificate_is_refused_until_its_new_pin_is_recorded(
    identity, tmp_path, real_transport
):
    old = identity.fingerprint
    remade = generate(["127.0.0.1"])
    remade_supervisor = _serve(remade, tmp_path)
    url = next(remade_supervisor)
    try:
        assert not _status(url, old).ok
        assert _status(url, remade.fingerprint).ok
    finally:
        remade_supervisor.close()


class _Recorder(httpx.BaseTransport):
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json={})


@pytest.mark.parametrize(
    ("url", "transport_name", "pin", "called"),
    [
        ("http://10.0.0.11:8701", "tls", "", False),
        ("http://gpu-a.internal:8701", "tls", "", False),
        ("http://10.0.0.11:8701", "plain-http", "", True),
        ("http://127.0.0.1:8701", "tls", "", True),
        ("http://10.0.0.11:8701", "tls", "sha256:" + "ab" * 32, False),
        ("https://10.0.0.11:8701", "plain-http", "", False),
    ],
)
def test_a_supervisor_the_loader_would_refuse_is_never_called(url, transport_name, pin, called):
    recorder = _Recorder()
    previous = transport.use_transport(recorder)
    try:
        trust = transport.TlsTrust(transport_name, pin, "gpu-a")
        result = client.SupervisorClient(url, token=TOKEN, tls=trust).gpu_memory(timeout=1.0)
    finally:
        transport.use_transport(previous)
    assert bool(recorder.requests) is called
    if not called:
        assert result.error is not None and result.error.kind == transport.REFUSED
        assert "not called: domain gpu-a: supervisor" in result.error.message
        assert TOKEN not in result.error.message


def test_client_for_takes_the_domains_transport_and_pin(seeded_fleet):
    domain = Domain.objects.get(fleet=seeded_fleet, slug="east")
    domain.supervisor_url = "https://10.0.0.11:8701"
    domain.supervisor_fingerprint = "sha256:" + "cd" * 32
    door = client.client_for(domain)
    assert door._tls == transport.TlsTrust("tls", "sha256:" + "cd" * 32, "east")
    domain.supervisor_url = "http://10.0.0.11:8701"
    domain.supervisor_fingerprint = ""
    refused = client.client_for(domain).status(timeout=1.0)
    assert refused.error is not None and refused.error.kind == transport.REFUSED


def test_plain_http_by_name_is_warned_about_once(seeded_fleet, caplog):
    domain = Domain.objects.get(fleet=seeded_fleet, slug="east")
    domain.supervisor_url, domain.supervisor_transport = "http://10.0.0.11:8701", "plain-http"
    with caplog.at_level("WARNING"):
        client.client_for(domain)
        client.client_for(domain)
    warned = [r for r in caplog.records if "over plain HTTP beyond loopback" in r.getMessage()]
    assert len(warned) == 1 and "domain east" in warned[0].getMessage()
