"""A supervisor's TLS identity: a self-signed certificate and key, and the SHA-256 pin of it.

Shared by both ends: the supervisor makes one for itself when it serves beyond loopback without
an operator certificate (supervisor/tls.py), and the control plane makes one for each launch of
a provisioned domain (fleets/reconciler/provision.py), ships it to the host as a secret and pins
it. Either way the trust is the pin, not a CA: the control plane compares the SHA-256 of the
certificate the peer presents (DER, as `openssl x509 -noout -fingerprint -sha256` hashes it)
with the one recorded for the domain, so names, issuers and expiry carry no weight and the
certificate can live for years.

A pin is written `sha256:<64 hex digits>`; `parse_pin` also takes openssl's `AB:CD:...` form, in
either case, and returns the one normal form Haru stores and compares.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PIN_PREFIX = "sha256:"
PIN_RULE = "must be sha256: followed by the certificate's 64 hex digits (SHA-256 of its DER)"
# A pin is what is trusted, not the dates: ten years, so an unattended host never finds its
# certificate expired (a client that checks dates, curl say, still sees real ones).
VALID_DAYS = 3650
_HEX = re.compile(r"[0-9a-f]{64}")


class PinError(ValueError):
    """A fingerprint that is not a SHA-256 pin."""


@dataclass(frozen=True)
class TlsIdentity:
    """A certificate and its private key, PEM; `key_pem` is a secret: never log or show it."""

    cert_pem: bytes
    key_pem: bytes = b""

    @property
    def fingerprint(self) -> str:
        return fingerprint_of_pem(self.cert_pem)

    def __repr__(self) -> str:
        # A dataclass repr would print the key into any traceback or log line that shows it.
        return f"TlsIdentity({self.fingerprint})"


def fingerprint_of_der(der: bytes) -> str:
    """The pin of a DER certificate: `sha256:<hex>`."""
    return PIN_PREFIX + hashlib.sha256(der).hexdigest()


def fingerprint_of_pem(pem: bytes) -> str:
    """The pin of the first certificate in a PEM text (a chain's leaf)."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise PinError(f"not a PEM certificate ({exc})") from None
    return fingerprint_of_der(cert.public_bytes(serialization.Encoding.DER))


def parse_pin(value: str) -> str:
    """Return the normal form of a SHA-256 pin (`sha256:` and lowercase hex); raise PinError."""
    text = value.strip().lower()
    if text.startswith(PIN_PREFIX):
        text = text[len(PIN_PREFIX) :]
    text = text.replace(":", "")
    if not _HEX.fullmatch(text):
        raise PinError(PIN_RULE)
    return PIN_PREFIX + text


def generate(names: Sequence[str], *, now: datetime.datetime | None = None) -> TlsIdentity:
    """A new self-signed server certificate (ECDSA P-256) for `names` (host names or addresses;
    informative only, the pin is what a client checks), with its unencrypted PKCS#8 key."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "haru-supervisor")])
    alt: list[x509.GeneralName] = []
    for name in dict.fromkeys(n.strip("[]") for n in names if n):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return TlsIdentity(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def peer_fingerprint(sock: ssl.SSLObject | ssl.SSLSocket) -> str | None:
    """The pin of the certificate a TLS peer presented (None: it presented none)."""
    # Positional: httpcore's "ssl_object" is the C-level _ssl._SSLSocket, which takes no
    # keyword arguments.
    der = sock.getpeercert(True)
    return fingerprint_of_der(der) if der else None
