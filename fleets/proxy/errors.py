"""The proxy's errors: each one knows its status, code and envelope body."""

from __future__ import annotations

import json

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

    def body(self) -> bytes:
        return envelope(self.code, self.message)


def envelope(code: str, message: str) -> bytes:
    """Render the error envelope shared with the REST API."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()


# Transient: worth a retry in a second (SDKs honour Retry-After).
RETRY_SOON = ((b"retry-after", b"1"),)


def _retry_soon(status: int, code: str, message: str) -> ProxyError:
    return ProxyError(status, code, message, headers=RETRY_SOON)


def unauthorized() -> ProxyError:
    return ProxyError(
        401,
        ErrorCode.UNAUTHORIZED,
        "missing or invalid bearer token",
        headers=[(b"www-authenticate", b'Bearer realm="haru"')],
    )


def invalid_request(message: str) -> ProxyError:
    return ProxyError(400, ErrorCode.INVALID_REQUEST, message)


def payload_too_large(limit: int) -> ProxyError:
    return ProxyError(
        413,
        ErrorCode.PAYLOAD_TOO_LARGE,
        f"request body exceeds HARU_CHAT_MAX_BODY_BYTES ({limit} bytes)",
        # The rest of the body is never read, so the connection cannot carry another request.
        headers=[(b"connection", b"close")],
    )


def fleet_not_found(message: str) -> ProxyError:
    return ProxyError(404, ErrorCode.FLEET_NOT_FOUND, message)


def model_not_found(message: str) -> ProxyError:
    return ProxyError(404, ErrorCode.MODEL_NOT_FOUND, message)


def model_unavailable(message: str) -> ProxyError:
    # Transient (a slot waking, a failover in progress): 503 with Retry-After, so SDKs retry.
    return _retry_soon(503, ErrorCode.MODEL_UNAVAILABLE, message)


def no_active_domain(message: str) -> ProxyError:
    return _retry_soon(503, ErrorCode.NO_ACTIVE_DOMAIN, message)


def state_store_unavailable(message: str) -> ProxyError:
    return _retry_soon(503, ErrorCode.STATE_STORE_UNAVAILABLE, message)


def upstream_timeout(message: str) -> ProxyError:
    return ProxyError(504, ErrorCode.UPSTREAM_TIMEOUT, message)


def upstream_unreachable(message: str) -> ProxyError:
    # The model server may be restarting or a failover may be under way: worth a retry.
    return _retry_soon(502, ErrorCode.UPSTREAM_UNREACHABLE, message)


def hold_expired(message: str) -> ProxyError:
    return _retry_soon(503, ErrorCode.MODEL_UNAVAILABLE, message)


def hold_capacity(limit: int) -> ProxyError:
    return ProxyError(
        503,
        ErrorCode.HOLD_CAPACITY_EXCEEDED,
        f"the model cannot take requests now and this server already holds as many waiting "
        f"requests as it may (HARU_CHAT_HOLD_MAX {limit}, or HARU_CHAT_HOLD_MAX_BYTES); retry",
        headers=RETRY_SOON,
    )


def draining(message: str) -> ProxyError:
    return _retry_soon(503, ErrorCode.SERVER_DRAINING, message)


def method_not_allowed(allowed: str) -> ProxyError:
    return ProxyError(
        405,
        ErrorCode.METHOD_NOT_ALLOWED,
        f"use {allowed}",
        headers=[(b"allow", allowed.encode())],
    )
