"""An HTTP edge's bounds, and the descriptor budget its connection cap needs."""

from __future__ import annotations

import logging
import resource
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from common.setting import Section, Setting, Words

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
    # Per client address, per process; the trusted proxy's own addresses are exempt (the
    # protocol reads them from uvicorn's `forwarded_allow_ips`).
    max_connections_per_address: int

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
            max_connections_per_address=values["max_connections_per_address"],
        )


class EdgeLimit(NamedTuple):
    """One process's default and words for one bound of its edge; the range is the family's
    (EDGE_RANGES) unless the process gives its own."""

    default: int
    doc: str
    low: int | None = None
    high: int | None = None
    shown_default: str | None = None


# Each bound's variable suffix and the range both processes accept, by EdgeLimits.from_settings'
# keys. The body cap has no shared range: each process sizes it to the bodies it serves.
EDGE_RANGES: dict[str, tuple[str, int | None, int | None]] = {
    "header_timeout_ms": ("HEADER_TIMEOUT_MS", 100, 600_000),
    "body_timeout_ms": ("BODY_TIMEOUT_MS", 100, 3_600_000),
    "keepalive_timeout_ms": ("KEEPALIVE_TIMEOUT_MS", 100, 3_600_000),
    "max_header_bytes": ("MAX_HEADER_BYTES", 4096, 16 * 1024**2),
    "max_headers": ("MAX_HEADERS", 16, 10_000),
    "max_body_bytes": ("MAX_BODY_BYTES", None, None),
    "max_connections": ("MAX_CONNECTIONS", 8, 1_000_000),
    "max_connections_per_address": ("MAX_CONNECTIONS_PER_ADDRESS", 1, 1_000_000),
}


class EdgeSettings(NamedTuple):
    """An edge's eight variables, in EDGE_RANGES' order (a settings table unpacks them)."""

    header_timeout_ms: Setting[int]
    body_timeout_ms: Setting[int]
    keepalive_timeout_ms: Setting[int]
    max_header_bytes: Setting[int]
    max_headers: Setting[int]
    max_body_bytes: Setting[int]
    max_connections: Setting[int]
    max_connections_per_address: Setting[int]


def edge_settings(prefix: str, limits: Mapping[str, EdgeLimit], section: Section) -> EdgeSettings:
    """Declare an edge's variables `<prefix><suffix>`, one for each key of EDGE_RANGES, all in
    `section`."""
    if set(limits) != set(EDGE_RANGES):
        raise ValueError(f"an edge declares exactly {sorted(EDGE_RANGES)}, not {sorted(limits)}")
    declared = []
    for key, (suffix, low, high) in EDGE_RANGES.items():
        limit = limits[key]
        words: Words = {"doc": limit.doc}
        if limit.shown_default is not None:
            words["shown_default"] = limit.shown_default
        low = low if limit.low is None else limit.low
        high = high if limit.high is None else limit.high
        if low is None or high is None:
            raise ValueError(f"{prefix}{suffix} needs its own range")
        declared.append(section.integer(f"{prefix}{suffix}", limit.default, low, high, **words))
    return EdgeSettings(*declared)


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
