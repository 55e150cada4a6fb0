"""The address a request came from, for login throttling (django-axes' AXES_CLIENT_IP_CALLABLE).

The server runs uvicorn without proxy headers (`serve`), so behind the reverse proxy every
request's REMOTE_ADDR is the proxy's own loopback address, and a throttle keyed on it would lock
a username out for everyone at once. Behind TLS (HARU_BEHIND_TLS, the reverse proxy's set-up)
a request from loopback is the proxy's, and the last X-Forwarded-For entry is the address the
proxy saw (nginx appends it; a client can only put entries before it).
"""

from __future__ import annotations

import ipaddress

from django.http import HttpRequest

from common.loopback import is_loopback
from fleets.base.conf import haru_settings


def client_address(request: HttpRequest) -> str:
    remote = str(request.META.get("REMOTE_ADDR", ""))
    if not haru_settings().behind_tls or not is_loopback(remote):
        return remote
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")[-1].strip()
    return forwarded if _is_address(forwarded) else remote


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
