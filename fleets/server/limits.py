"""The server edge's bounds, read once from the settings, and the descriptor budget they need.

The bounds and the descriptor fitting are the shared edge's (common/edge/limits.py, also
the supervisor's); this module reads the control plane's own settings (HARU_HTTP_*).
"""

from __future__ import annotations

import logging

# Re-exported: the descriptor budget is read and raised through the resource module, which
# tests fake from here.
import resource  # noqa: F401

from common.edge import limits as shared
from common.edge.limits import FDS_PER_CONNECTION, RESERVED_FDS, EdgeLimits
from fleets.base.conf import haru_settings
from fleets.base.setting_table import HaruSettings

__all__ = ["FDS_PER_CONNECTION", "RESERVED_FDS", "EdgeLimits", "fit_descriptors", "from_settings"]

log = logging.getLogger("haru.serve")


def from_settings() -> EdgeLimits:
    """Read the HARU_HTTP_* limits (validated at start-up, haru/settings.py)."""
    config = haru_settings()
    return EdgeLimits.from_settings(
        {
            "header_timeout_ms": config.http_header_timeout_ms,
            "body_timeout_ms": config.http_body_timeout_ms,
            "keepalive_timeout_ms": config.http_keepalive_timeout_ms,
            "max_header_bytes": config.http_max_header_bytes,
            "max_headers": config.http_max_headers,
            "max_body_bytes": config.http_max_body_bytes,
            "max_connections": config.http_max_connections,
            "max_connections_per_address": config.http_max_connections_per_address,
        }
    )


def fit_descriptors(limits: EdgeLimits) -> EdgeLimits:
    """Raise the soft descriptor limit as far as the cap needs (up to the hard limit); lower
    the cap, with a warning, when even the hard limit cannot hold it."""
    return shared.fit_descriptors(limits, setting=HaruSettings.http_max_connections.env, log=log)
