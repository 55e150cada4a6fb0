"""The server edge's bounds, read once from the settings, and the descriptor budget they need.

The bounds and the descriptor fitting are the shared edge's (common/edge/limits.py, also
the supervisor's); this module reads the control plane's own settings (HARU_HTTP_*).
"""

from __future__ import annotations

import logging

# Re-exported: the descriptor budget is read and raised through the resource module, which
# tests fake from here.
import resource  # noqa: F401

from django.conf import settings

from common.edge import limits as shared
from common.edge.limits import FDS_PER_CONNECTION, RESERVED_FDS, EdgeLimits

__all__ = ["FDS_PER_CONNECTION", "RESERVED_FDS", "EdgeLimits", "fit_descriptors", "from_settings"]

log = logging.getLogger("haru.serve")


def from_settings() -> EdgeLimits:
    """Read the HARU_HTTP_* limits (validated at start-up, haru/settings.py)."""
    prefix = "http_"
    return EdgeLimits.from_settings(
        {
            key[len(prefix) :]: value
            for key, value in settings.HARU.items()
            if key.startswith(prefix)
        }
    )


def fit_descriptors(limits: EdgeLimits) -> EdgeLimits:
    """Raise the soft descriptor limit as far as the cap needs (up to the hard limit); lower
    the cap, with a warning, when even the hard limit cannot hold it."""
    return shared.fit_descriptors(limits, setting="HARU_HTTP_MAX_CONNECTIONS", log=log)
