"""Refuse an HTTP request whose Host is not one of ALLOWED_HOSTS, before any route answers.

Django checks the Host for its own views, but the chat proxy's paths are served ahead of Django
(`fleets/proxy/asgi.py`; `fleets/server/direct.py` under `manage.py serve`), so without this a
page that rebinds its DNS name to the server's address reaches the proxy of a token-less
(loopback) server. With `ALLOWED_HOSTS = ["*"]` (a token deployment by default) nothing is
checked and nothing is spent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.http.request import split_domain_port, validate_host

from fleets.base import conf
from fleets.base.errors import ErrorCode

REFUSED_BODY = json.dumps(
    {
        "error": {
            "code": ErrorCode.INVALID_HOST,
            "message": "this server does not answer to that Host",
        }
    }
).encode()
REFUSED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", b"%d" % len(REFUSED_BODY)),
]


def host_allowed(host: str | None, allowed_hosts: list[str]) -> bool:
    if "*" in allowed_hosts:
        return True
    domain, _port = split_domain_port((host or "").lower())
    return bool(domain) and validate_host(domain, allowed_hosts)


def refused(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request with these (lowercase-named) headers names a Host not allowed."""
    allowed = conf.allowed_hosts()
    if "*" in allowed:
        return False
    host = next((v for k, v in headers if k.lower() == b"host"), b"")
    return not host_allowed(host.decode("latin-1"), allowed)


class AllowedHostsGuard:
    """ASGI middleware: 400 `invalid_host` for an HTTP request to a Host not allowed."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "http" and refused(scope.get("headers", [])):
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": REFUSED_HEADERS,
                }
            )
            await send({"type": "http.response.body", "body": REFUSED_BODY})
            return None
        return await self.application(scope, receive, send)
