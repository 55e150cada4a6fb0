"""The control plane's door into the agent for profile drift: the fingerprint a supervisor would
report for a layout's engine profile, computed by the supervisor's own parser and registry, so
the two sides can never disagree on what a profile means."""

from __future__ import annotations

import logging
from typing import Any

from supervisor.engines.fingerprint import profile_fingerprint
from supervisor.engines.profile import parse_profile
from supervisor.engines.registry import default_registry

log = logging.getLogger(__name__)


def layout_fingerprint(raw: dict[str, Any], *, model_name: str, gpu_index: int) -> str | None:
    """The fingerprint a supervisor would report for the engine profile `raw` of a layout, or
    None when the supervisor would refuse that profile (it has no fingerprint)."""
    errors: list[str] = []
    try:
        parsed = parse_profile(
            raw,
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
