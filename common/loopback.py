"""Whether an address never leaves the machine: the one test behind every "beyond loopback"
rule (a supervisor's or the server's bind needs a token and TLS beyond it; an `http://`
supervisor URL beyond it must say `plain-http`). Standard library only: the supervisor, the
server and the pure core share it.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """Tell whether a host (a bind address or a URL's host) is loopback: `localhost` or a
    literal loopback address, IPv6 in brackets or not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        # A hostname could resolve anywhere; only the literal loopback forms count.
        return False


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is loopback (never leaves the machine)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    return is_loopback(host)
