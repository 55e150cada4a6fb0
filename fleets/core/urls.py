"""Rules for the supervisor and serving URLs Haru stores and calls.

Credentials never ride in these URLs: the input paths refuse a `user:password@` part, and the
output paths strip one from rows written before that rule (a bare `user@` too: the user part is
often a token itself). The input paths also refuse a query or a fragment: Haru appends paths.
Supervisors are optionally limited to an allow-list of hosts, so a mistyped or planted
`supervisorUrl` can never receive a supervisor token.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

# The authority's userinfo: everything between "scheme://" and the last "@" before the path.
# By pattern, not urlsplit: a malformed URL (which urlsplit refuses) must still be stripped.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")
# The same inside free text (an error message, a log line): the authority stops at whitespace.
_USERINFO_IN_TEXT = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*@")

USERINFO_RULE = "must not carry credentials (user:password@); supervisors take a bearer token"


# Haru appends a path to these URLs (`/v1/status`, `/v1/chat/completions`): after a query or a
# fragment that path lands inside it, the calls miss, and chat clients are shown the URL.
QUERY_RULE = "must not carry a query (?...) or a fragment (#...); Haru appends paths to this URL"


def url_problem(url: str) -> str | None:
    """Why a supervisor or serving URL is refused at input (credentials, a query or a
    fragment), or None."""
    if has_userinfo(url):
        return USERINFO_RULE
    if "?" in url or "#" in url:
        return QUERY_RULE
    return None


def has_userinfo(url: str) -> bool:
    """Whether `url` carries a `user[:password]@` part."""
    return bool(_USERINFO.match(url))


def without_userinfo(url: str) -> str:
    """Return `url` with any `user[:password]@` part removed; other URLs unchanged."""
    return _USERINFO.sub(r"\1", url)


def scrub_urls(text: str) -> str:
    """Remove the userinfo of every URL inside `text` (messages, log lines)."""
    return _USERINFO_IN_TEXT.sub(r"\1", text)


class HostPatternError(ValueError):
    """A host pattern that is neither a valid network (CIDR) nor a host name pattern."""


def parse_host_patterns(values: Sequence[str]) -> tuple[str, ...]:
    """Validate allow-list entries: `10.0.0.0/8` (a network), or a host name or glob such as
    `gpu-*.internal` (matched case-insensitively against the URL's host, never its port)."""
    out = []
    for value in values:
        pattern = value.strip().lower()
        if not pattern:
            continue
        if "/" in pattern:
            try:
                ipaddress.ip_network(pattern, strict=False)
            except ValueError:
                raise HostPatternError(f"{value!r} is not a network (CIDR)") from None
        elif not re.fullmatch(r"[a-z0-9*?.\-:\[\]]+", pattern):
            raise HostPatternError(f"{value!r} is not a host name pattern")
        out.append(pattern)
    return tuple(out)


def host_allowed(url: str, patterns: Sequence[str]) -> bool:
    """Whether `url`'s host matches one of `patterns` (an empty allow-list allows every host)."""
    if not patterns:
        return True
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    if not host:
        return False
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in patterns:
        if "/" in pattern:
            if address is not None and address in ipaddress.ip_network(pattern, strict=False):
                return True
        elif fnmatch.fnmatchcase(host, pattern.strip("[]")):
            return True
    return False


def supervisor_url_problem(url: str, patterns: Sequence[str]) -> str | None:
    """Why Haru must not call or store this supervisor URL, or None when it may."""
    problem = url_problem(url)
    if problem:
        return problem
    if not host_allowed(url, patterns):
        host = urlsplit(without_userinfo(url)).hostname or "?"
        return (
            f"host {host!r} is not in HARU_SUPERVISOR_HOSTS ({', '.join(patterns)}); "
            "a supervisor token is only sent to an allowed host"
        )
    return None
