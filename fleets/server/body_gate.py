"""Who may make the control plane's server wait for a request body.

The edge (common/edge/protocol.py, `_body_allowed`) asks only for a body that did not come with
its headers, before any of it is read: an unauthenticated client is answered 401 at once and
never holds a connection slot for the body deadline (Django reads the whole body before any
authentication). The check is cheap and needs no database:

- the proxy's paths (`/v1/chat/completions`, `/v1/completions`, `/v1/models...`): a known token,
  chat or operator (`token_scope`), whenever any token is configured (`chat_auth_required`);
- every other path, when HARU_API_TOKEN is set: a known token, a bearer credential shaped as a
  stored API token (`stored_token_shaped`), or a cookie named as Django's session or CSRF
  cookie. A stored token's or a cookie's validity needs the database, so its shape is enough here;
  Django checks it before acting (the session, and CSRF on every unsafe method: the login form's
  POST carries the CSRF cookie its GET set). A client that forges the name (or the token's
  shape) passes this check only to be held as any busy connection is: closed to make room until
  its body's first byte, under its address's cap, and cut at the body deadline;
- no token configured (loopback development, `manage.py serve` refuses anything else): any.
"""

from __future__ import annotations

import functools

from common.bearer import bearer_credential
from fleets.base.conf import haru_settings
from fleets.base.tokens import chat_auth_required, token_scope
from fleets.core.access import stored_token_shaped


@functools.cache
def _cookie_names() -> tuple[bytes, ...]:
    from django.conf import settings  # noqa: PLC0415 - read once Django serves requests

    return (settings.SESSION_COOKIE_NAME.encode(), settings.CSRF_COOKIE_NAME.encode())


@functools.cache
def _proxy_paths() -> tuple[tuple[bytes, ...], bytes]:
    from fleets.proxy import handler  # noqa: PLC0415 - imports the app registry's modules

    return tuple(p.encode() for p in handler.ENDPOINTS), handler.MODEL_PREFIX.encode()


def body_allowed(url: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request for `url` with these header fields may wait for its body."""
    path = url.partition(b"?")[0]
    exact, model_prefix = _proxy_paths()
    if path in exact or path.startswith(model_prefix):
        return not chat_auth_required() or _has_token(headers)
    if not haru_settings().api_token:
        return True
    return _has_token(headers, stored=True) or _has_cookie(headers)


def _has_token(headers: list[tuple[bytes, bytes]], *, stored: bool = False) -> bool:
    for name, value in headers:
        if name == b"authorization":
            header = value.decode("latin-1")
            if token_scope(header) is not None:
                return True
            if not stored:
                return False  # the proxy takes no stored token (fleets/api/auth.py)
            secret = bearer_credential(header)
            return secret is not None and stored_token_shaped(secret)
    return False


def _has_cookie(headers: list[tuple[bytes, bytes]]) -> bool:
    wanted = _cookie_names()
    for name, value in headers:
        if name == b"cookie":
            for pair in value.split(b";"):
                if pair.partition(b"=")[0].strip() in wanted:
                    return True
    return False
