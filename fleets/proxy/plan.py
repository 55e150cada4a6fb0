"""One request's stance on stream continuation: whether it is kept, and the body it is sent with.

Worked out from the parsed body as the request is routed (`handler.forward`), since only the
route says whether its engine can continue (fleets/core/continuation.py has the rules).
"""

from __future__ import annotations

from fleets.base.conf import haru_settings
from fleets.core import continuation as rules
from fleets.proxy.snapshots import Route
from fleets.proxy.stream_ledger import Ledger

_UNSET = "unset"


class Plan:
    """One request's stance on continuation, worked out from its parsed body as needed: a
    request to an engine that cannot continue pays for no more than building this."""

    __slots__ = ("document", "endpoint", "body", "streamed", "_refusal", "client_ids", "reruns",
                 "kept", "injected")  # fmt: skip

    def __init__(self, document: dict, body: bytes, endpoint: str) -> None:
        self.document = document
        self.endpoint = endpoint
        self.body = body
        self.streamed = document.get("stream") is True
        self.client_ids = document.get("return_token_ids") is True  # theirs: left untouched
        self._refusal: str | None = _UNSET
        self.reruns = 0  # times this non-streamed request was sent again after a cut
        self.kept = False  # the last body sent is kept for a continuation
        self.injected = False  # ... and asked for ids on the proxy's behalf (stripped)

    @property
    def refusal(self) -> str | None:
        """Why a cut of this stream cannot be continued, None if it can."""
        if self._refusal is _UNSET:
            refusal = rules.refusal(self.document, self.endpoint)
            asked = self.document.get("return_token_ids")
            if asked is not None and asked is not True:
                refusal = refusal or "ids_refused"  # the client turned them off explicitly
            self._refusal = refusal
        return self._refusal

    def continues(self, route: Route) -> bool:
        """Whether a stream sent on `route` is kept for a continuation."""
        if not (self.streamed and route.continues) or self.refusal is not None:
            return False
        config = haru_settings()
        return config.chat_continue_max_ids > 0 and config.chat_continue_max > 0

    def reruns_on(self, route: Route) -> bool:
        """Whether a non-streamed request cut on `route` (nothing sent yet) is sent again."""
        return (
            not self.streamed
            and route.continues
            and self.reruns < haru_settings().chat_continue_max
        )

    def body_for(self, route: Route, body: bytes | None = None) -> bytes:
        """The body to send on `route`: with `return_token_ids` when the stream is kept.
        `body`: the request's body as rewritten for the route (an adapter's version), if it is."""
        body = body or self.body
        self.kept = self.continues(route)
        self.injected = False
        if not self.kept or self.client_ids:
            return body
        self.injected = True
        at = body.index(b"{") + 1
        return body[:at] + b'"return_token_ids":true,' + body[at:]

    def ledger(self, route: Route) -> Ledger:
        config = haru_settings()
        return Ledger(
            self.endpoint,
            strip=self.injected,
            limit=config.chat_continue_max_ids,
            total_limit=config.chat_continue_max_ids_total,
            nulls=route.engine != "sim",
        )
