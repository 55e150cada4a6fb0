"""Making a supervisor's TLS identity: a self-signed certificate and its key.

Both ends make them: the supervisor for itself when it serves beyond loopback without an
operator certificate (supervisor/tls.py), and the control plane for each launch of a
provisioned domain (fleets/reconciler/provision.py), which ships it to the host as a secret and
pins it. Either way the trust is the pin (common/tls_pin.py), not a CA: the control plane
compares the SHA-256 of the certificate the peer presents with the one recorded for the domain,
so names, issuers and expiry carry no weight and the certificate can live for years.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.tls_pin import TlsIdentity

# A pin is what is trusted, not the dates: ten years, so an unattended host never finds its
# certificate expired (a client that checks dates, curl say, still sees real ones).
VALID_DAYS = 3650


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
