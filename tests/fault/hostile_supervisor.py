"""A hostile supervisor, run as its own process in the fault suite's deployment.

    python -m tests.fault.hostile_supervisor --port P --mode trickle|oversized --log FILE

Answers every request on `--port` the same way, whatever the path:

- `trickle`: a valid status line and headers, then one body byte every 0.5 s, forever;
- `oversized`: a chunked body of spaces as fast as the client reads it, without end (a "huge
  /v1/status"; no Content-Length, so only a cap on the bytes read stops it).

Appends one JSON line per connection to `--log` when the client hangs up: when it was accepted,
when the client closed it (seconds since the epoch) and how many body bytes were sent, so the
test can say how long Haru kept a stalled call open.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import socketserver
import threading
import time

BLOCK = b" " * 65536


class Hostile(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        accepted = time.time()
        sock.recv(65536)  # the request; its content does not matter here
        sent = 0
        try:
            if self.server.mode == "trickle":  # type: ignore[attr-defined]
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                sock.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
                while True:
                    sock.sendall(b"1\r\n \r\n")
                    sent += 1
                    # Wait 0.5 s, but see a hang-up at once (readable with nothing to read).
                    readable, _, _ = select.select([sock], [], [], 0.5)
                    if readable and not sock.recv(1):
                        break
            else:
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                sock.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
                while True:
                    sock.sendall(b"10000\r\n" + BLOCK + b"\r\n")
                    sent += len(BLOCK)
        except OSError:
            pass  # the client hung up: what it should do
        record = {"accepted": accepted, "closed": time.time(), "bytes": sent}
        with self.server.lock, open(self.server.log, "a") as f:  # type: ignore[attr-defined]
            f.write(json.dumps(record) + "\n")


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=("trickle", "oversized"), required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Hostile)
    server.mode = args.mode  # type: ignore[attr-defined]
    server.log = args.log  # type: ignore[attr-defined]
    server.lock = threading.Lock()  # type: ignore[attr-defined]
    server.serve_forever()


if __name__ == "__main__":
    main()
