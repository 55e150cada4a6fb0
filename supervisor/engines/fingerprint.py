"""A profile's fingerprint: a stable hash of everything in it that affects the launch.

The control plane computes the same value from its layout and compares it with what
`/v1/status` reports, so it can tell a server started from an older profile. Standard library
only, so the server can import it without the rest of the supervisor.
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


def fingerprints_match(reported: str | None, expected: str | None) -> bool | None:
    """Compare fingerprints; unknown on either side is None, never a match."""
    if not reported or not expected:
        return None
    return reported == expected


def fingerprint_profile_json(data: Any, *, model_name: str, gpu_index: int) -> str | None:
    """Fingerprint a profile as written in config or a layout; None when it does not parse.

    This is the call for the control plane: it holds the same profile JSON as the supervisor's
    config, and gets the value `/v1/status` reports for a server started from it.
    """
    from supervisor.engines.profile import parse_profile
    from supervisor.engines.registry import default_registry

    errors: list[str] = []
    profile = parse_profile(
        data,
        "profile",
        errors,
        model_name=model_name,
        default_gpu_index=gpu_index,
        engine_names=default_registry().names(),
    )
    return profile_fingerprint(profile) if profile is not None and not errors else None
