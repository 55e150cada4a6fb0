"""How the control plane may reach a domain's supervisor: HTTPS beyond loopback, and its pin.

A domain's supervisor is reached over HTTPS unless its host is this machine's loopback, or the
domain says plain HTTP by name (`supervisorTransport: plain-http`): the bearer token and every
control answer otherwise cross the network in clear. An HTTPS supervisor is trusted through a
CA (`HARU_SUPERVISOR_CA_BUNDLE`, else the system's store) or, when the domain records one,
through its pin (`supervisorFingerprint: sha256:<hex>`): the SHA-256 of the certificate, which
then replaces every CA and name check (a self-signed certificate is enough).

The layout loader, the layout service, the admin and the client all ask `transport_problem`, so
a URL the loader refuses is never called either (a row written before this rule, or by hand).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from common.loopback import is_loopback_url
from common.tls_pin import PIN_RULE, PinError, parse_pin

TLS = "tls"
PLAIN_HTTP = "plain-http"
TRANSPORTS = (TLS, PLAIN_HTTP)


def normal_pin(value: str) -> str:
    """The stored form of a fingerprint (`sha256:` and lowercase hex); "" stays ""; raise
    ValueError with the rule."""
    if not value:
        return ""
    try:
        return parse_pin(value)
    except PinError:
        raise ValueError(PIN_RULE) from None


def transport_problem(url: str, transport: str, fingerprint: str) -> tuple[str, str] | None:
    """Why this supervisor URL cannot be called as the domain says, as (field, rule); None when
    it can. An empty URL (a provisioned domain before its cluster is up) has no problem."""
    if transport not in TRANSPORTS:
        return "supervisorTransport", f"must be {' or '.join(TRANSPORTS)}"
    if fingerprint:
        try:
            parse_pin(fingerprint)
        except PinError:
            return "supervisorFingerprint", PIN_RULE
    if not url:
        return None
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:
        return None  # the URL rules refuse it
    if scheme == "https":
        if transport == PLAIN_HTTP:
            return "supervisorTransport", f"{PLAIN_HTTP} goes with an http:// supervisorUrl"
        return None
    if fingerprint:
        return (
            "supervisorFingerprint",
            "pins a TLS certificate: the supervisorUrl must be https://",
        )
    if transport == PLAIN_HTTP or is_loopback_url(url):
        return None
    return (
        "supervisorUrl",
        "http:// beyond loopback sends the supervisor token in clear: use https:// (the "
        "supervisor serves HTTPS beyond loopback by default; pin its certificate with "
        f"supervisorFingerprint), or say supervisorTransport: {PLAIN_HTTP} to mean it",
    )
