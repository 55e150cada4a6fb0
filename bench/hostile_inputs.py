"""Measure how Haru's edges treat hostile input: how fast each is cut, and what it costs.

    .venv/bin/python bench/hostile_inputs.py [--inputs | --floods] [--connections 4000]
                                             [--seconds 120] [--reopen-per-s 1000]
                                             [--sources 1] [--json]

`--floods` (issue 29; bench/hostile_fleet.py): against a running simulated fleet, the four
connection floods (upgrade with body, header-only POST, endless trailers, CRLF keep-alive),
`--connections` of each at once from 127.0.0.2 (or spread over `--sources` addresses from
127.0.0.2 on), held and reopened as they close (at most
`--reopen-per-s` a second each), for `--seconds`, first at the server, then at the active's
supervisor; a normal client probes once a second. Prints per target the rounds served of the
total, the server's and supervisor's memory growth and the failovers. Without either flag, both
parts run; `--inputs` (issue 11):

Starts hostile servers on loopback and prints, for the real supervisor client: seconds until a
supervisor trickling one byte every 0.5 s (in the body, then in the headers) is cut, and the
peak Python memory while a 1 GB chunked body is refused; then seconds and peak memory to refuse
a 969-byte YAML anchor bomb as a layout, `'[' * 100000` as a supervisor answer, and a 256 MB
chunked body sent to the supervisor's API. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import socketserver
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "haru.settings")

import django  # noqa: E402

django.setup()

from starlette.requests import Request  # noqa: E402

from fleets.base.errors import LayoutError  # noqa: E402
from fleets.layouts.loader import read_layout_file  # noqa: E402
from fleets.reconciler.supervisor.client import SupervisorClient  # noqa: E402
from fleets.reconciler.supervisor.transport import use_transport  # noqa: E402
from supervisor.api import MAX_BODY_BYTES, read_body  # noqa: E402

# The classic "billion laughs": nine levels of nine aliases each, under a kilobyte.
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]"
        for i in range(8)
    ]
)


class Hostile(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.recv(65536)
        mode = self.server.mode  # type: ignore[attr-defined]
        try:
            if mode == "trickle-body":
                sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    sock.sendall(b"1\r\n \r\n")
                    time.sleep(0.5)
            elif mode == "trickle-headers":
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.5)
            elif mode == "1gb":
                sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                block = b"10000\r\n" + b" " * 65536 + b"\r\n"
                for _ in range(16384):
                    sock.sendall(block)
            else:
                body = b"[" * 100_000
                sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
                sock.sendall(body)
        except OSError:
            return


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def measured(label: str, fn) -> None:
    tracemalloc.start()
    started = time.monotonic()
    outcome = fn()
    took = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{label:<52} {took:7.2f} s  peak {peak / 2**20:8.2f} MiB  -> {outcome}")


def supervisor_body_256mb() -> str:
    chunks = [0]

    async def receive():
        chunks[0] += 1
        more = chunks[0] < 4096
        return {"type": "http.request", "body": b" " * 65536, "more_body": more}

    scope = {"type": "http", "method": "POST", "path": "/v1/probe", "headers": []}

    async def run() -> str:
        try:
            await read_body(Request(scope, receive))
        except Exception as exc:  # noqa: BLE001 - the refusal is the figure
            return f"{type(exc).__name__} after {chunks[0]} chunks of 64 KiB (cap {MAX_BODY_BYTES})"
        return "accepted"

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--inputs", action="store_true", help="only the hostile inputs (issue 11)")
    part.add_argument("--floods", action="store_true", help="only the connection floods")
    parser.add_argument("--connections", type=int, default=4000, help="per attack")
    parser.add_argument("--seconds", type=float, default=120, help="per target")
    parser.add_argument("--reopen-per-s", type=int, default=1000, help="per attack")
    parser.add_argument(
        "--sources",
        type=int,
        default=1,
        help="attacker addresses (127.0.0.2 on): more than one spreads each flood so that the "
        "per-address cap alone cannot turn it away",
    )
    parser.add_argument("--json", action="store_true", help="print the floods' figures as JSON")
    args = parser.parse_args()
    if not args.floods:
        inputs()
    if not args.inputs:
        from bench import hostile_fleet  # noqa: PLC0415 - only for the floods

        results = hostile_fleet.run(
            connections=args.connections,
            seconds=args.seconds,
            reopen_per_s=args.reopen_per_s,
            sources=args.sources,
        )
        if args.json:
            print(json.dumps(results, indent=1))
        else:
            hostile_fleet.report(results)


def inputs() -> None:
    server = Server(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    use_transport(None)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    sup = SupervisorClient(url, token=None, on_error=None)

    for mode in ("trickle-body", "trickle-headers", "1gb", "deep"):
        server.mode = mode  # type: ignore[attr-defined]
        measured(
            f"supervisor {mode} (GET /v1/status, budget 2 s)",
            lambda: (lambda r: f"{r.error.kind}: {r.error.message[-60:]}")(sup.status(timeout=2.0)),
        )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.yaml"
        path.write_text(BOMB)

        def bomb() -> str:
            try:
                read_layout_file(path)
            except LayoutError as exc:
                return exc.errors[0][-70:]
            return "accepted"

        measured(f"layout: {len(BOMB)}-byte YAML anchor bomb", bomb)
    measured("supervisor API: 256 MB chunked request body", supervisor_body_256mb)
    server.shutdown()


if __name__ == "__main__":
    main()
