"""A certificate's pin (common/tls_pin.py): the SHA-256 of its DER, one normal form whatever form
it was written in, computed from PEM with the standard library as `cryptography` computes it."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from common.tls_identity import generate
from common.tls_pin import PinError, fingerprint_of_pem, parse_pin


def test_the_pin_is_the_sha256_of_the_der_as_cryptography_computes_it():
    identity = generate(["gpu-a.internal", "10.0.0.11"])
    cert = x509.load_pem_x509_certificate(identity.cert_pem)
    assert identity.fingerprint == "sha256:" + cert.fingerprint(hashes.SHA256()).hex()
    # A chain pins its leaf, the first certificate.
    other = generate(["ca"])
    assert fingerprint_of_pem(identity.cert_pem + other.cert_pem) == identity.fingerprint


def test_a_new_identity_names_its_hosts_and_serves_only_as_a_server():
    cert = x509.load_pem_x509_certificate(generate(["gpu-a.internal", "10.0.0.11"]).cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["gpu-a.internal"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.11"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_every_written_form_of_a_pin_is_one_stored_form():
    digest = "0123456789abcdef" * 4
    openssl = ":".join(digest[i : i + 2].upper() for i in range(0, 64, 2))
    for written in (f"sha256:{digest}", f"SHA256:{digest.upper()}", openssl, f" {digest} "):
        assert parse_pin(written) == f"sha256:{digest}"
    for bad in ("sha1:" + digest[:40], digest[:63], "sha256:" + "g" * 64, ""):
        with pytest.raises(PinError):
            parse_pin(bad)


def test_no_certificate_no_pin_and_the_key_never_in_a_repr():
    with pytest.raises(PinError, match="no PEM certificate"):
        fingerprint_of_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    identity = generate(["h"])
    assert "PRIVATE" not in repr(identity) and identity.fingerprint in repr(identity)
