"""The private interfaces of uvicorn, httpx and httpcore that Haru relies on, in one place.

Both processes serve HTTP through a subclass of uvicorn's httptools protocol (the bounded edge,
common/edge/protocol.py; the control plane's chat path, fleets/server/), and the control plane
calls supervisors through httpx on a deadline-bounded httpcore backend
(fleets/reconciler/supervisor/deadline.py). uvicorn documents no protocol API to subclass, and
httpx no way to give its transport a network backend, so those modules use names their authors may
change in any release. Every such name is imported or touched here and nowhere else, and
`RELIED_ON` lists what of it is relied on: tests/tools/test_private_apis.py checks each entry
against the installed version and fails naming the dependency, its version and what changed.
docs/private-apis.md says, for each, why no public API does it and which versions were checked.

The server-only dependencies (Django, Django REST framework, psycopg, psycopg_pool) have their
own list in fleets/base/private_apis.py: a GPU host installs none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.protocols.websockets import websockets_sansio_impl
from uvicorn.server import Server
from uvicorn.supervisors import multiprocess

__all__ = [
    "RELIED_ON",
    "STATUS_LINE",
    "FlowControl",
    "HttpToolsProtocol",
    "Reliance",
    "WorkerProcess",
    "RequestResponseCycle",
    "get_client_addr",
    "get_path_with_query_string",
    "note_captured_signal",
    "serve_workers_with",
    "set_transport_pool",
    "websocket_handshake_done",
    "worker_server",
]


@dataclass(frozen=True)
class Reliance:
    """One private interface of one dependency and what of it Haru relies on.

    `target` is "module:qualified.name". `parameters` names, per method of the target, the
    parameters (after self) in the order Haru passes or overrides them. `source` holds text the
    target's source must contain: an attribute it sets or reads (`self.parser =`), a call it
    makes, a message it logs; what Haru reads or overrides only works while it is there.
    """

    dependency: str
    target: str
    used_by: str
    parameters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: tuple[str, ...] = ()


RELIED_ON: list[Reliance] = [
    Reliance(
        "uvicorn",
        "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol",
        "common/edge/protocol.py, fleets/server/protocol.py",
        parameters={
            "__init__": ("config", "server_state", "app_state", "_loop"),
            "connection_made": ("transport",),
            "connection_lost": ("exc",),
            "data_received": ("data",),
            "handle_websocket_upgrade": (),
            "send_400_response": ("msg",),
            "on_message_begin": (),
            "on_headers_complete": (),
            "on_body": ("body",),
            "on_message_complete": (),
            "on_response_complete": (),
            "timeout_keep_alive_handler": (),
            "_start_asgi_task": ("cycle", "app"),
            "_unset_keepalive_if_required": (),
            "_should_upgrade": (),
            "_unsupported_upgrade_warning": (),
        },
        source=(
            # The state the edge and the chat path read or replace per connection and request.
            "self.parser =",
            "self.cycle",
            "self.pipeline",
            "self.flow",
            "self.server_state =",
            "self.connections =",
            "self.tasks =",
            "self.url",
            "self.headers",
            "self.scope",
            "self.limit_concurrency =",
            "self.root_path =",
            "self.app =",
            "self.expect_100_continue",
            "self.access_logger =",
            "self.access_log =",
            "self.timeout_keep_alive =",
            # The client's address the per-address cap counts, set in connection_made.
            "self.client = get_remote_addr(transport)",
            # An accepted upgrade's handshake deadline reads the WebSocket protocol off it.
            "self.transport.set_protocol(protocol)",
            # Trailer fields after a chunked body are added to the request's headers.
            "self.headers.append((name, value))",
            # The edge's lazy keep-alive timer replaces this one: it must still be the only one.
            "self._unset_keepalive_if_required()",
            "self.timeout_keep_alive_task",
        ),
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.http.httptools_impl:RequestResponseCycle",
        "common/edge/protocol.py, fleets/server/direct.py (ChatCycle has its fields)",
        source=(
            "self.scope =",
            "self.transport =",
            "self.flow =",
            "self.access_logger =",
            "self.access_log =",
            "self.default_headers =",
            "self.message_event =",
            "self.on_response =",
            "self.disconnected =",
            "self.keep_alive =",
            "self.waiting_for_100_continue =",
            "self.body =",
            "self.more_body =",
            "self.response_started =",
            "self.response_complete =",
        ),
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.websockets.websockets_sansio_impl:WebSocketsSansIOProtocol",
        "common/edge/protocol.py (an accepted upgrade's handshake deadline)",
        source=("self.handshake_complete = False", "self.handshake_complete = True"),
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.http.httptools_impl:STATUS_LINE",
        "fleets/server/direct.py",
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.http.flow_control:FlowControl",
        "fleets/server/direct.py",
        parameters={"drain": (), "pause_reading": (), "resume_reading": ()},
        source=("self.write_paused",),
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.utils:get_client_addr",
        "fleets/server/direct.py (the access log line)",
        parameters={"": ("scope",)},
    ),
    Reliance(
        "uvicorn",
        "uvicorn.protocols.utils:get_path_with_query_string",
        "fleets/server/direct.py (the access log line)",
        parameters={"": ("scope",)},
    ),
    Reliance(
        "uvicorn",
        "uvicorn.server:Server",
        "fleets/proxy/drain.py (a signal the drain takes over is still re-raised at exit)",
        parameters={"handle_exit": ("sig", "frame")},
        source=("self._captured_signals",),
    ),
    Reliance(
        "uvicorn",
        "uvicorn.supervisors.multiprocess:Process",
        "fleets/proxy/drain.py, fleets/management/commands/serve.py (each worker's server)",
        parameters={"__init__": ("config", "sockets")},
        # The supervisor builds its workers from the module global, by name.
        source=("self._server", "Process(self.config, self.sockets)"),
    ),
    Reliance(
        "httpx",
        "httpx:HTTPTransport",
        "fleets/reconciler/supervisor/deadline.py (the pool on the deadline-bounded backend)",
        source=(
            "self._pool = httpcore.ConnectionPool(",
            "self._pool.handle_request(",
            "self._pool.close()",
        ),
    ),
    Reliance(
        "httpcore",
        "httpcore:ConnectionPool",
        "fleets/reconciler/supervisor/deadline.py",
        parameters={
            "__init__": (
                "ssl_context",
                "proxy",
                "max_connections",
                "max_keepalive_connections",
                "keepalive_expiry",
            )
        },
        source=("network_backend",),
    ),
]


def set_transport_pool(transport: httpx.HTTPTransport, pool: Any) -> None:
    """Serve `transport`'s requests from `pool` (httpx builds its own, with no way to give it a
    network backend): an object with httpcore's pool methods (`handle_request`, `close`, and
    the context manager's)."""
    transport._pool = pool


def note_captured_signal(server: Server, sig: int) -> None:
    """Record `sig` as uvicorn's handle_exit does, so uvicorn re-raises it once it has stopped."""
    server._captured_signals.append(sig)


# One worker process of `--workers N` (uvicorn's multiprocess supervisor builds them by name).
WorkerProcess = multiprocess.Process


def worker_server(process: multiprocess.Process, make: type[Server]) -> Server:
    """The server of one `--workers N` worker process, built as `make` on first use."""
    if process._server is None:
        process._server = make(config=process.config)
    return process._server


def serve_workers_with(process_class: type[multiprocess.Process]) -> None:
    """Make uvicorn's multiprocess supervisor start its workers as `process_class`."""
    multiprocess.Process = process_class  # type: ignore[misc]


def websocket_handshake_done(protocol: object) -> bool:
    """Whether uvicorn's WebSocket protocol (the websockets sans-I/O implementation, the one
    `ws="auto"` picks with `websockets` installed) has completed its opening handshake. Any
    other protocol is taken as done: its own deadlines, if any, hold it."""
    if isinstance(protocol, websockets_sansio_impl.WebSocketsSansIOProtocol):
        return protocol.handshake_complete
    return True
