"""Which pages may open the dashboard's WebSocket: the ones this server served.

A browser sends the page's `Origin` with every WebSocket handshake, and it sends the session
cookie along even when the page belongs to someone else (cross-site WebSocket hijacking).
Channels' `AllowedHostsOriginValidator` compares the Origin with `ALLOWED_HOSTS`, which is `*`
in a token deployment, so any page was accepted. The rule here is the one Django applies to a
form POST (its CSRF origin check): the Origin must name the host the browser connected to (the
`Host` header, itself one of `ALLOWED_HOSTS`), or be one of `CSRF_TRUSTED_ORIGINS`
(`HARU_TRUSTED_ORIGINS`). A handshake without an Origin is refused: every browser sends one,
and the consumers serve only browsers (staff sessions).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host


def origin_allowed(
    origin: str | None,
    host: str | None,
    *,
    allowed_hosts: Iterable[str],
    trusted_origins: Iterable[str],
) -> bool:
    """True when a page at `origin` may open a socket to the server the browser reached as
    `host`."""
    if not origin or not host:
        return False
    domain, _port = split_domain_port(host.lower())
    if not domain or not validate_host(domain, list(allowed_hosts)):
        return False
    if origin.lower() in {o.lower() for o in trusted_origins}:
        return True
    parts = urlsplit(origin.lower())
    # "null" (a sandboxed frame or a file: page) has no scheme and never matches.
    return parts.scheme in {"http", "https"} and parts.netloc == host.lower()


class SameOriginValidator:
    """ASGI middleware: refuse a WebSocket handshake from a page of another origin (403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            headers = {
                name.decode("latin-1").lower(): value.decode("latin-1")
                for name, value in scope.get("headers", [])
            }
            if not origin_allowed(
                headers.get("origin"),
                headers.get("host"),
                allowed_hosts=settings.ALLOWED_HOSTS,
                trusted_origins=settings.CSRF_TRUSTED_ORIGINS,
            ):
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
