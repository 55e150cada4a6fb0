"""An HTTP edge's bounds, and the descriptor budget its connection cap needs."""

from __future__ import annotations

import logging
import resource
from collections.abc import Mapping
from dataclasses import dataclass, replace

# Descriptors kept back from client connections: a database pool, calls to supervisors or model
# servers, children's pipes, metrics files, logs. A cap that left none of these would turn an
# idle-connection flood into "Too many open files" elsewhere in the process, which is the
# failure being prevented.
RESERVED_FDS = 256
# Each client connection may hold a second descriptor: the upstream connection it is answered
# through (the chat proxy's model server, the supervisor's call to one).
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

    @classmethod
    def from_settings(cls, values: Mapping[str, int]) -> EdgeLimits:
        """Build the limits from settings as both processes spell them: deadlines in ms."""
        return cls(
            header_timeout_s=values["header_timeout_ms"] / 1000,
            body_timeout_s=values["body_timeout_ms"] / 1000,
            keepalive_timeout_s=values["keepalive_timeout_ms"] / 1000,
            max_header_bytes=values["max_header_bytes"],
            max_headers=values["max_headers"],
            max_body_bytes=values["max_body_bytes"],
            max_connections=values["max_connections"],
        )


def fit_descriptors(limits: EdgeLimits, *, setting: str, log: logging.Logger) -> EdgeLimits:
    """Raise the soft descriptor limit as far as the cap needs (up to the hard limit); lower
    the cap, with a warning naming `setting`, when even the hard limit cannot hold it."""
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
        "%s=%d needs %d open files but the limit is %d: capping client connections at %d "
        "(raise `ulimit -n` to keep the setting)",
        setting,
        limits.max_connections,
        needed,
        soft,
        fitted,
    )
    return replace(limits, max_connections=fitted)
