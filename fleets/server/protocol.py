"""The control plane's HTTP protocol: the shared edge, plus the chat direct path.

The deadlines and limits at every phase of a connection (header and body deadlines, header
size and count, the body cap, the keep-alive idle limit, the per-process connection cap that
closes the longest idle connection) are `common/edge/protocol.py`'s, shared with the
supervisor's server; this subclass reads them from the settings (HARU_HTTP_*, one read per
process) and adds the chat path.

POST chat and completions are answered by `fleets/server/direct.py` on uvicorn's parsed request,
without ASGI messages and, for a target spelled exactly, on a lean cycle of its own (the proxy's
hot path); everything else (parsing, the ASGI cycle, WebSocket upgrade, pipelining, flow
control) is uvicorn's. The subclass adds nothing per request to the shared edge beyond the chat
path itself: its hooks replace calls the edge makes anyway (`edge_limits` once per connection,
`_own_cycle` once per request), so the chat path runs the same code as before the split
(bench/server_edges.py and bench/proxy.py measure it).
"""

from __future__ import annotations

import contextvars
import functools
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

from common.edge.protocol import EdgeHttpProtocol
from common.private_apis import RequestResponseCycle
from fleets.server import body_gate
from fleets.server import limits as edge_limits

if TYPE_CHECKING:
    from fleets.server.direct import Cycle, CycleIO

log = logging.getLogger("haru.serve")


@functools.cache
def current_limits() -> edge_limits.EdgeLimits:
    """This process's limits: read once (each uvicorn worker process reads its own)."""
    return edge_limits.fit_descriptors(edge_limits.from_settings())


@functools.cache
def _direct() -> ModuleType:
    """The chat path's module, imported on the first request.

    Not at this module's import: `serve --workers N` unpickles this class in each spawned
    worker before Django is set up, and the chat path needs Django's app registry.
    """
    from fleets.server import direct  # noqa: PLC0415 - needs the app registry (above)

    return direct


class HaruHttpProtocol(EdgeHttpProtocol):
    BODY_LIMIT_SETTING = "HARU_HTTP_MAX_BODY_BYTES"
    # The dashboard's live pages (fleets/live/urls.py): the only WebSocket routes.
    WEBSOCKET_PATHS = (b"/ws/",)
    # The settings' limits, read once per process: the hook the edge calls per connection.
    edge_limits = staticmethod(current_limits)
    # The chat request being served on the direct path, told when the connection is lost.
    direct: CycleIO | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.direct is not None:
            self.direct.client_left()

    def _body_allowed(self) -> bool:
        # Only for a body that did not come with its headers (never the usual chat request).
        return body_gate.body_allowed(self.url, self.headers)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # `app is self.app`: not uvicorn's 503 for an exceeded concurrency limit.
        endpoint = _direct().endpoint_of(cycle) if app is self.app else None
        if endpoint is None:
            super()._start_asgi_task(cycle, app)
            return
        self._start_chat(cycle, endpoint)

    def _start_chat(self, cycle: Cycle, endpoint: str) -> None:
        chat = _direct()
        io = chat.CycleIO(self, cycle)
        coro = chat.serve(io, endpoint)
        if self.config.reset_contextvars:
            task = self.loop.create_task(coro, context=contextvars.Context())
        else:
            task = self.loop.create_task(coro)
        io.task = task  # before it first runs: the flow takes it from here, not the loop
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _own_cycle(self) -> bool:
        """uvicorn's on_headers_complete for a POST to a chat target spelled exactly, with a
        lean cycle (direct.ChatCycle); False, having done nothing, for any other request."""
        chat = _direct()
        endpoint = chat.TARGETS.get(self.url)
        parser = self.parser
        if (
            endpoint is None
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
            or self.limit_concurrency is not None
            or self.root_path
        ):
            return False
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = self.url.decode("ascii")
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        existing = self.cycle
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        cycle = self.cycle = chat.ChatCycle(self, scope, keep_alive=keep_alive)
        if existing is None or existing.response_complete:
            self._start_chat(cycle, endpoint)
        else:
            # Pipelined behind a request still being answered: started when that one is done.
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))
        return True
