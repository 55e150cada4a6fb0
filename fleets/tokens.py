"""The API token check shared by the REST API and the chat proxy.

At the bottom of the layers (it reads only the settings), so the proxy authenticates without
importing the REST API and DRF.
"""

from __future__ import annotations

import hmac

from django.conf import settings


def token_matches(header: str | None) -> bool:
    """Return whether an Authorization header carries the configured API token."""
    expected = settings.HARU["api_token"]
    if not expected or not header:
        return False
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), expected.encode())
