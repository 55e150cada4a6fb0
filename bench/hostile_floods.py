"""Floods of hostile connections from one address, held and reopened as they close, and a
normal client probing once a round: what the hostile-client suite (tests/e2e/test_e2e_hostile.py)
and bench/hostile_inputs.py run against a server and a supervisor.

Issue 29's attacks on the HTTP edge, and issue 11's before them, each as an opening (sent once a
connection is made) and a tick (sent again every tick while it stays open):

- `upgrade_body`: an upgrade request to WebSocket carrying a body (uvicorn handed it to the
  WebSocket protocol, which never answered nor closed it);
- `header_only_post`: a POST's headers and none of its declared body, no credentials (held for
  the whole body deadline, Django reading the body before authenticating);
- `endless_trailers`: a chunked body whose trailer section never ends (no limit counted it);
- `crlf_keepalive`: one request, then blank lines for ever (each reset the keep-alive deadline);
- `idle`, `trickled_headers`, `huge_headers`: the first round's (nothing; a header byte per tick;
  64 KiB of one header value per tick).

Attackers connect from HOSTILE_SOURCE (Linux routes all of 127/8 to loopback), so the normal
client on 127.0.0.1 is another address, as a real one would be.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

Address = tuple[str, int]
HOSTILE_SOURCE = "127.0.0.2"
_IP_BIND_ADDRESS_NO_PORT = 24  # Linux: let connect() pick the port, so ports are not used up


class Attack(NamedTuple):
    opening: bytes
    tick: bytes = b""


def attacks(*, post_path: str, extra_headers: str = "") -> dict[str, Attack]:
    """Every attack, each request to `post_path` where a route with a body matters; the extra
    header lines (`Name: value\\r\\n`...) go into every request (a credential, say)."""
    host = f"Host: 127.0.0.1\r\n{extra_headers}"
    return {
        "upgrade_body": Attack(
            f"POST /healthz HTTP/1.1\r\n{host}Connection: Upgrade\r\nUpgrade: websocket\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Content-Length: 5\r\n\r\n".encode()
        ),
        "header_only_post": Attack(
            f"POST {post_path} HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n".encode()
        ),
        "endless_trailers": Attack(
            f"POST {post_path} HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: ".encode(),
            b"a" * 4096,
        ),
        "crlf_keepalive": Attack(f"GET /healthz HTTP/1.1\r\n{host}\r\n".encode(), b"\r\n"),
        "idle": Attack(b""),
        "trickled_headers": Attack(f"GET /healthz HTTP/1.1\r\n{host}".encode(), b"X"),
        "huge_headers": Attack(f"GET /healthz HTTP/1.1\r\n{host}X-Big: ".encode(), b"a" * 65536),
    }


NEW_ATTACKS = ("upgrade_body", "header_only_post", "endless_trailers", "crlf_keepalive")


class Flood:
    """`count` connections from `source` to `address`, each opened with the attack's opening
    and fed its tick every `tick_s`, reopened as the server closes them (at most `reopen`
    per tick, so refusals do not turn into a connect storm)."""

    def __init__(
        self,
        address: Address,
        attack: Attack,
        count: int,
        *,
        source: str | Sequence[str] = HOSTILE_SOURCE,
        tick_s: float = 0.25,
        reopen: int | None = None,
    ) -> None:
        self.address = address
        self.attack = attack
        # Several sources spread the connections over addresses (socket i from source i mod n),
        # so that a per-address cap alone cannot turn the flood away.
        self.sources = (source,) if isinstance(source, str) else tuple(source)
        self.tick_s = tick_s
        self.reopen = count if reopen is None else reopen
        self.sockets: list[socket.socket | None] = [None] * count
        self.opened = self.closed_by_server = self.refused = 0
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for sock in self.sockets:
            if sock is not None:
                sock.close()

    @property
    def open_now(self) -> int:
        return sum(sock is not None for sock in self.sockets)

    def _open(self, i: int) -> socket.socket | None:
        sock = socket.socket()
        # Closed with a reset: no TIME_WAIT left behind on this side.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
        sock.settimeout(2)
        try:
            sock.bind((self.sources[i % len(self.sources)], 0))
            sock.connect(self.address)
            if self.attack.opening:
                sock.sendall(self.attack.opening)
        except OSError:
            self.refused += 1
            sock.close()
            return None
        sock.setblocking(False)
        self.opened += 1
        return sock

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            budget = self.reopen
            for i, sock in enumerate(self.sockets):
                if self._stop.is_set():
                    return
                if sock is not None and self._closed(sock):
                    sock.close()
                    sock = self.sockets[i] = None
                if sock is None:
                    if budget > 0:
                        budget -= 1
                        self.sockets[i] = self._open(i)
                elif self.attack.tick:
                    try:
                        sock.send(self.attack.tick)
                    except BlockingIOError:
                        pass  # the server is not reading: its buffers are full
                    except OSError:
                        sock.close()
                        self.sockets[i] = None
            self._stop.wait(max(0.0, self.tick_s - (time.monotonic() - started)))

    def _closed(self, sock: socket.socket) -> bool:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            self.closed_by_server += 1
            return True
        if not data:
            self.closed_by_server += 1
            return True
        if data.startswith(b"HTTP/1.1 ") and len(data) >= 12 and data[9:12].isdigit():
            self.statuses[int(data[9:12])] += 1
        return False


class Rounds:
    """A normal client's probes, once a round (every `period_s`) in a thread; a round is served
    when every probe returns True (an exception is a failure)."""

    def __init__(self, probes: dict[str, Callable[[], bool]], period_s: float = 1.0) -> None:
        self.probes = probes
        self.period_s = period_s
        self.total = self.served = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Rounds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def run_once(self) -> None:
        failed = []
        for name, probe in self.probes.items():
            try:
                ok = probe()
            except Exception as exc:  # a probe's failure, whatever it is, fails the round
                ok = False
                name = f"{name} ({type(exc).__name__}: {exc})"
            if not ok:
                failed.append(name)
        self.total += 1
        if failed:
            self.failures.append(f"round {self.total}: {', '.join(failed)}")
        else:
            self.served += 1
