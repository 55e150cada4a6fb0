"""A profile's fingerprint: a stable hash of everything in it that affects the launch.

The supervisor fingerprints the profile it launched each server from and reports it in
`/v1/status`; the control plane computes the same value from its layout
(`supervisor.engines.drift`) to tell a server started from an older profile.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX = "sha256:"


def fingerprint_canonical(canonical: dict[str, Any]) -> str:
    """Hash a canonical profile dict: sorted keys, no whitespace, UTF-8."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def profile_fingerprint(profile: Any) -> str:
    """Fingerprint an `EngineProfile` (anything with a `canonical()` method)."""
    return fingerprint_canonical(profile.canonical())
