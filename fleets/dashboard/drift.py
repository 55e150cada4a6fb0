"""Profile drift: does a running model server still match the layout's engine profile?

The supervisor reports the fingerprint of the profile it launched each server from; the layout
holds the profile the operator wants. The fingerprint of a layout profile is the supervisor's to
say (`supervisor.engines.drift`, the control plane's door into the agent for drift); when
the layout profile does not parse, the expected value is unknown, and unknown never reads as a
match.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from supervisor.engines.drift import layout_fingerprint

MATCH, DRIFT, UNKNOWN = "match", "drift", "unknown"


@lru_cache(maxsize=512)
def _expected(profile_json: str, model_name: str, gpu_index: int) -> str | None:
    return layout_fingerprint(json.loads(profile_json), model_name=model_name, gpu_index=gpu_index)


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
