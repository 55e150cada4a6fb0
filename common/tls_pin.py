"""A TLS certificate's pin: the SHA-256 of its DER bytes, written `sha256:<64 hex digits>`.

Standard library only, so the pure core (fleets/core/supervisor_tls.py) and the drivers may use
it; making certificates (which needs `cryptography`) lives in common/tls_identity.py. The pin is
what `openssl x509 -noout -fingerprint -sha256` prints, in another form: `parse_pin` takes
openssl's `AB:CD:...` form too, in either case, and returns the one normal form Haru stores and
compares.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
from dataclasses import dataclass

PIN_PREFIX = "sha256:"
PIN_RULE = "must be sha256: followed by the certificate's 64 hex digits (SHA-256 of its DER)"
_HEX = re.compile(r"[0-9a-f]{64}")
_PEM_CERT = re.compile(
    r"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END CERTIFICATE-----"
)


class PinError(ValueError):
    """A fingerprint that is not a SHA-256 pin, or a text with no certificate to pin."""


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
    match = _PEM_CERT.search(pem.decode("ascii", "replace"))
    if match is None:
        raise PinError("no PEM certificate found")
    try:
        der = base64.b64decode("".join(match.group(1).split()), validate=True)
    except (binascii.Error, ValueError):
        raise PinError("the PEM certificate is not valid base64") from None
    return fingerprint_of_der(der)


def parse_pin(value: str) -> str:
    """Return the normal form of a SHA-256 pin (`sha256:` and lowercase hex); raise PinError."""
    text = value.strip().lower()
    if text.startswith(PIN_PREFIX):
        text = text[len(PIN_PREFIX) :]
    text = text.replace(":", "")
    if not _HEX.fullmatch(text):
        raise PinError(PIN_RULE)
    return PIN_PREFIX + text


def peer_fingerprint(sock: ssl.SSLObject | ssl.SSLSocket) -> str | None:
    """The pin of the certificate a TLS peer presented (None: it presented none)."""
    # Positional: httpcore's "ssl_object" is the C-level _ssl._SSLSocket, which takes no
    # keyword arguments.
    der = sock.getpeercert(True)
    return fingerprint_of_der(der) if der else None
