"""The supervisor credential a domain's cluster is launched with.

One function so per-domain credentials (derived from a master key) can replace the shared
`HARU_SUPERVISOR_TOKEN` in one place; the driver passes the value only as a SkyPilot secret.
"""

from __future__ import annotations

from django.conf import settings


def supervisor_token_for(domain) -> str | None:
    """Return the token the domain's supervisor must require (today: the shared one)."""
    del domain  # every domain shares the configured token until per-domain tokens exist
    return settings.HARU["supervisor_token"]
