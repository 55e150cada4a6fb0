"""A real HTTPS server on loopback, in a thread, answering every GET with a supervisor's status
(what FakeHost reports) and noting the Authorization header each request carried: the far end of
the control plane's own transport in the TLS and pin tests."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.reconciler.fakes import FakeHost


class StatusHandler(BaseHTTPRequestHandler):
    body = json.dumps(FakeHost(models={"llama-small": False})._status()).encode()
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(context: ssl.SSLContext, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve over `context` on a free loopback port; yield the base URL naming `host`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), StatusHandler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    StatusHandler.seen = []
    try:
        yield f"https://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
