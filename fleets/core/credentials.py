"""Per-domain supervisor tokens derived from one master key, so nothing secret is stored.

A domain's token is HMAC-SHA256(master key, context || domain id): a supervisor that leaks or
collects its token learns nothing about any other domain's, nor about the master key, and a
domain created at run time (provisioning) has its token the moment it has an id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid

# Versioned, so a future derivation (another hash, another input) cannot collide with this one.
_CONTEXT = b"haru/supervisor-token/v1\x00"


def derive_supervisor_token(master_key: str, domain_id: uuid.UUID | str) -> str:
    """Return the bearer token the supervisor of domain `domain_id` requires.

    The id is normalized (a UUID spelled upper-case or without hyphens gives the same token);
    the result is 43 URL-safe characters (256 bits), fit for an environment variable.
    """
    if not master_key:
        raise ValueError("the master key is empty")
    canonical = str(uuid.UUID(str(domain_id)))
    digest = hmac.new(master_key.encode(), _CONTEXT + canonical.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
