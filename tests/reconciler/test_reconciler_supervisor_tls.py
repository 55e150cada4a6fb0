"""HTTPS to a supervisor: a real TLS server whose certificate comes from a CA made here; the
control plane's own transport (the deadline-bounded pool) verifies it against
HARU_SUPERVISOR_CA_BUNDLE, and refuses it with the system's trust store alone."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest
import trustme

from fleets.reconciler.supervisor import client, transport
from tests.reconciler.tls_status_server import StatusHandler, serving

# A real TLS server on a loopback socket, in a thread.
pytestmark = pytest.mark.integration


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_supervisor(ca) -> Iterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    with serving(context, host="localhost") as url:
        yield url


def _status(settings, url: str, ca_bundle: str | None) -> transport.Call:
    settings.HARU = {**settings.HARU, "supervisor_ca_bundle": ca_bundle}
    return client.SupervisorClient(url, token="t" * 40).status(timeout=5.0)


def test_a_supervisor_certificate_from_the_bundle_is_verified(
    tls_supervisor, ca, real_transport, settings, tmp_path
):
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    result = _status(settings, tls_supervisor, str(bundle))
    assert result.ok, result.error
    assert result.value.slots[0].models[0].name == "llama-small"
    assert StatusHandler.seen == ["Bearer " + "t" * 40]


def test_without_the_bundle_the_certificate_is_refused_and_no_token_is_sent(
    tls_supervisor, real_transport, settings
):
    result = _status(settings, tls_supervisor, None)
    assert result.error is not None and result.error.kind == transport.NETWORK
    assert "CERTIFICATE_VERIFY_FAILED" in result.error.message
    assert StatusHandler.seen == []  # the handshake failed before any request was sent


def test_another_ca_in_the_bundle_is_refused_then_the_right_one_is_picked_up(
    tls_supervisor, ca, real_transport, settings, tmp_path
):
    other = tmp_path / "other.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    result = _status(settings, tls_supervisor, str(other))
    assert result.error is not None and "CERTIFICATE_VERIFY_FAILED" in result.error.message
    assert StatusHandler.seen == []
    # A changed setting rebuilds the shared pool: no connection verified by the old bundle
    # is kept.
    right = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(right))
    assert _status(settings, tls_supervisor, str(right)).ok
