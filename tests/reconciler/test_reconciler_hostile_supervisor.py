"""Hostile supervisors on loopback against the real client (real sockets, default transport):
a trickler, an oversized body, deep nesting. Each is a clean per-call error, within the call's
budget, and never aborts a fleet's tick."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from fleets.models import Domain
from fleets.reconciler.supervisor import client, transport
from fleets.reconciler.tick import fleet_tick


class _Hostile(socketserver.BaseRequestHandler):
    mode = "deep"

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.recv(65536)  # the request; its content does not matter here
        try:
            if self.server.mode == "trickle":  # type: ignore[attr-defined]
                # A valid status line and headers, then one body byte every 0.5 s, forever.
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                sock.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
                while True:
                    sock.sendall(b"1\r\n \r\n")
                    time.sleep(0.5)
            elif self.server.mode == "trickle-headers":  # type: ignore[attr-defined]
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.5)
            elif self.server.mode == "huge-chunked":  # type: ignore[attr-defined]
                sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                block = b" " * 65536
                while True:  # 1 GB if nobody stops reading
                    sock.sendall(b"10000\r\n" + block + b"\r\n")
            elif self.server.mode == "huge-declared":  # type: ignore[attr-defined]
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                sock.sendall(b" " * 65536)
                time.sleep(5)
            else:
                body = b"[" * 100_000
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n"
                sock.sendall(head.encode() + body)
        except OSError:
            return  # the client hung up: what it should do


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def hostile() -> Iterator:
    server = _Server(("127.0.0.1", 0), _Hostile)
    server.mode = "deep"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    previous = transport.use_transport(None)  # the production transport, real sockets
    try:
        yield server
    finally:
        transport.use_transport(previous)
        server.shutdown()
        server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("mode", ["trickle", "trickle-headers"])
def test_a_trickling_supervisor_is_cut_at_the_calls_overall_deadline(hostile, mode):
    hostile.mode = mode
    started = time.monotonic()
    result = client.SupervisorClient(_url(hostile), token=None).status(timeout=2.0)
    took = time.monotonic() - started
    assert result.error is not None and result.error.kind == transport.TIMEOUT
    assert took < 3.0, took  # one byte per 0.5 s never resets an overall deadline


@pytest.mark.parametrize("mode", ["huge-chunked", "huge-declared"])
def test_an_oversized_body_is_refused_at_the_cap_without_reading_it_all(hostile, mode):
    hostile.mode = mode
    sup = client.SupervisorClient(_url(hostile), token=None, max_response_bytes=1024 * 1024)
    result = sup.status(timeout=5.0)
    assert result.error is not None and result.error.kind == transport.BAD_BODY
    assert "exceeds 1048576 bytes" in result.error.message


def test_deeply_nested_json_is_a_clean_bad_body_error(hostile):
    result = client.SupervisorClient(_url(hostile), token=None).status(timeout=5.0)
    assert result.error is not None and result.error.kind == transport.BAD_BODY
    assert "nested deeper than" in result.error.message


@pytest.mark.django_db
def test_a_hostile_supervisor_never_aborts_the_fleets_tick(fake_clock, seeded_fleet, hostile):
    # Both domains answer with '[' * 100000: the tick still runs to the end and records why.
    Domain.objects.filter(fleet=seeded_fleet).update(supervisor_url=_url(hostile))
    result = fleet_tick(fleet_id=seeded_fleet.id, poll_s=0)
    assert result.ran
    for domain in Domain.objects.filter(fleet=seeded_fleet):
        assert domain.heartbeat_failing_since is not None  # judged, per domain, as failing
