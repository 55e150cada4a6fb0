"""The server edge's bounds, read once from the settings, and the descriptor budget they need."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, replace

from django.conf import settings

log = logging.getLogger("haru.serve")

# Descriptors kept back from client connections: database pool, supervisor calls, metrics
# files, the reconcile loop, logs. A cap that left none of these would turn an idle-connection
# flood into "Too many open files" in the reconcile tick, which is the failure being prevented.
RESERVED_FDS = 256
# Each client connection may hold a second descriptor: the chat proxy's upstream connection.
FDS_PER_CONNECTION = 2


@dataclass(frozen=True)
class EdgeLimits:
    header_timeout_s: float  # connection open (or first byte of a request) -> end of headers
    body_timeout_s: float  # end of headers -> end of the request body
    keepalive_timeout_s: float  # idle between two requests on one connection
    max_header_bytes: int  # request line plus headers
    max_headers: int
    max_body_bytes: int  # one request's body, declared or streamed (chunked)
    max_connections: int  # per process


def from_settings() -> EdgeLimits:
    haru = settings.HARU
    return EdgeLimits(
        header_timeout_s=haru["http_header_timeout_ms"] / 1000,
        body_timeout_s=haru["http_body_timeout_ms"] / 1000,
        keepalive_timeout_s=haru["http_keepalive_timeout_ms"] / 1000,
        max_header_bytes=haru["http_max_header_bytes"],
        max_headers=haru["http_max_headers"],
        max_body_bytes=haru["http_max_body_bytes"],
        max_connections=haru["http_max_connections"],
    )


def fit_descriptors(limits: EdgeLimits) -> EdgeLimits:
    """Raise the soft descriptor limit as far as the cap needs (up to the hard limit); lower
    the cap, with a warning, when even the hard limit cannot hold it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = limits.max_connections * FDS_PER_CONNECTION + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit to %d: %s", target, exc)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limits
    fitted = max(8, (soft - RESERVED_FDS) // FDS_PER_CONNECTION)
    log.warning(
        "HARU_HTTP_MAX_CONNECTIONS=%d needs %d open files but the limit is %d: capping client "
        "connections at %d (raise `ulimit -n` to keep the setting)",
        limits.max_connections,
        needed,
        soft,
        fitted,
    )
    return replace(limits, max_connections=fitted)
