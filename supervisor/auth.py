"""Bearer-token authentication for every `/v1/` route."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from common.bearer import bearer_matches
from supervisor.errors import error_body

_UNAUTHORIZED = json.dumps(
    error_body("unauthorized", "a valid bearer token is required (Authorization: Bearer <token>)")
).encode()


def _protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class BearerAuth:
    """Refuse `/v1/` requests without the right bearer token; `/healthz` stays open.

    Runs before routing, so an unknown `/v1/` path answers 401 rather than revealing which
    routes exist. The token is compared in constant time and never logged.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._token is None or not _protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                    (b"www-authenticate", b'Bearer realm="haru-supervisor"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})

    def _authorized(self, scope: Scope) -> bool:
        assert self._token is not None
        return bearer_matches(scope["headers"], self._token)
