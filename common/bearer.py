"""The bearer credential an `Authorization` header carries: one parse for every gate.

The supervisor's gate (`supervisor/auth.py`), the control plane's REST API and its chat proxy
(`fleets/base/tokens.py`) all read the header here, so a header one accepts the others accept.

RFC 9110 writes `credentials = auth-scheme [ 1*SP ( token68 / #auth-param ) ]`: one or more
spaces only. Accepted here, as the original Haru accepts it: the scheme in any case, then spaces
or tabs, the credential (no whitespace inside), then optional trailing spaces or tabs
(`Bearer<TAB>token` included). Being lenient in the separator cannot let a wrong token in: the
credential itself is still compared in full, in constant time, by the caller. Anything else
(another scheme, no separator, a second word after the credential) carries no credential.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable

_BEARER = re.compile(r"bearer[ \t]+([^ \t]+)[ \t]*", re.IGNORECASE)


def bearer_credential(header: str | None) -> str | None:
    """The credential of a `Bearer` Authorization header, or None when it carries none."""
    if not header:
        return None
    match = _BEARER.fullmatch(header)
    return match.group(1) if match else None


def bearer_matches(headers: Iterable[tuple[bytes, bytes]], token: bytes) -> bool:
    """Whether raw header fields (lowercase names, as the server parses them) carry `token` as
    their first Authorization's bearer credential, compared in constant time."""
    for name, value in headers:
        if name == b"authorization":
            # Header bytes are latin-1 (every byte one character), so none is lost.
            presented = bearer_credential(value.decode("latin-1"))
            return presented is not None and hmac.compare_digest(presented.encode("latin-1"), token)
    return False
