"""Profile drift: does a running model server still match the layout's engine profile?

The supervisor reports the fingerprint of the profile it launched each server from; the layout
holds the profile the operator wants. The profile parser and fingerprint function live in the
supervisor package (standard library only, shipped in the same distribution); when the layout
profile does not parse, the expected value is unknown, and unknown never reads as a match.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from typing import Any

from supervisor.engines.fingerprint import profile_fingerprint
from supervisor.engines.profile import parse_profile
from supervisor.engines.registry import default_registry

log = logging.getLogger(__name__)

MATCH, DRIFT, UNKNOWN = "match", "drift", "unknown"


@lru_cache(maxsize=512)
def _expected(profile_json: str, model_name: str, gpu_index: int) -> str | None:
    errors: list[str] = []
    try:
        parsed = parse_profile(
            json.loads(profile_json),
            "profile",
            errors,
            model_name=model_name,
            default_gpu_index=gpu_index,
            engine_names=default_registry().names(),
        )
    except Exception:  # noqa: BLE001 - a profile the supervisor would refuse has no fingerprint
        log.debug("layout profile of %s does not parse", model_name, exc_info=True)
        return None
    if parsed is None or errors:
        return None
    return profile_fingerprint(parsed)


def expected_fingerprint(profile: Any, *, model_name: str, gpu_index: int) -> str | None:
    """Return the fingerprint the supervisor would report for `profile`, or None if unknown."""
    if not isinstance(profile, dict) or not profile:
        return None
    try:
        key = json.dumps(profile, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return _expected(key, model_name, gpu_index)


def drift_status(reported: str | None, expected: str | None) -> str:
    """Return match, drift or unknown; unknown on either side is never a match."""
    if not reported or not expected:
        return UNKNOWN
    return MATCH if reported == expected else DRIFT
