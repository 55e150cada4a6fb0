"""The proxy's errors: each one knows its status, code and envelope body."""

from __future__ import annotations

import json
from collections.abc import Callable

from fleets.base.errors import ErrorCode


class ProxyError(Exception):
    """An error answered to the client as `{"error": {"code", "message"}}` with `status`."""

    def __init__(self, status: int, code: str, message: str, *, headers=()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        # Extra (name, value) byte pairs, e.g. WWW-Authenticate or Retry-After.
        self.headers = tuple(headers)
        # The model server took the request, then its connection was lost before any byte of
        # the answer (a crash, never a configuration fault): what may be asked again elsewhere.
        self.lost = False

    def body(self) -> bytes:
        return envelope(self.code, self.message)


def envelope(code: str, message: str) -> bytes:
    """Render the error envelope shared with the REST API."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()


# Transient: worth a retry in a second (SDKs honour Retry-After).
RETRY_SOON = ((b"retry-after", b"1"),)


def _answer(status: int, code: str, *, retry: bool = False) -> Callable[[str], ProxyError]:
    """The factory of one error kind: its status and code fixed, the message given."""
    headers = RETRY_SOON if retry else ()

    def make(message: str) -> ProxyError:
        return ProxyError(status, code, message, headers=headers)

    return make


def unauthorized() -> ProxyError:
    return ProxyError(
        401,
        ErrorCode.UNAUTHORIZED,
        "missing or invalid bearer token",
        headers=[(b"www-authenticate", b'Bearer realm="haru"')],
    )


def payload_too_large(limit: int) -> ProxyError:
    return ProxyError(
        413,
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"request body exceeds HARU_CHAT_MAX_BODY_BYTES ({limit} bytes)",
        # The rest of the body is never read, so the connection cannot carry another request.
        headers=[(b"connection", b"close")],
    )


invalid_request = _answer(400, ErrorCode.INVALID_REQUEST)
fleet_not_found = _answer(404, ErrorCode.FLEET_NOT_FOUND)
model_not_found = _answer(404, ErrorCode.MODEL_NOT_FOUND)
# Transient (a slot waking, a failover in progress): 503 with Retry-After, so SDKs retry.
model_unavailable = _answer(503, ErrorCode.MODEL_UNAVAILABLE, retry=True)
no_active_domain = _answer(503, ErrorCode.NO_ACTIVE_DOMAIN, retry=True)
state_store_unavailable = _answer(503, ErrorCode.STATE_STORE_UNAVAILABLE, retry=True)
upstream_timeout = _answer(504, ErrorCode.UPSTREAM_TIMEOUT)
# The model server may be restarting or a failover may be under way: worth a retry.
upstream_unreachable = _answer(502, ErrorCode.UPSTREAM_UNREACHABLE, retry=True)
hold_expired = _answer(503, ErrorCode.MODEL_UNAVAILABLE, retry=True)
draining = _answer(503, ErrorCode.SERVER_DRAINING, retry=True)
# An adapter's name whose routed versions are not loaded and probed on the serving domain:
# refused before anything is sent (never answered by the base model), worth a retry.
adapter_not_ready = _answer(503, ErrorCode.ADAPTER_NOT_READY, retry=True)


def hold_capacity(limit: int) -> ProxyError:
    return ProxyError(
        503,
        ErrorCode.HOLD_CAPACITY_EXCEEDED,
        f"the model cannot take requests now and this server already holds as many waiting "
        f"requests as it may (HARU_CHAT_HOLD_MAX {limit}, or HARU_CHAT_HOLD_MAX_BYTES); retry",
        headers=RETRY_SOON,
    )


def method_not_allowed(allowed: str) -> ProxyError:
    return ProxyError(
        405,
        ErrorCode.METHOD_NOT_ALLOWED,
        f"use {allowed}",
        headers=[(b"allow", allowed.encode())],
    )
