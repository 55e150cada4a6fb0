"""Hostile HTTP clients on raw sockets, and what they do to the server they are pointed at.

Finding 1 of issue 11 (idle-connection floods, slowloris, oversized headers), as helpers the
edge tests of both servers (tests/supervisor/test_supervisor_edges.py; the control plane's keeps
its own in tests/server/test_server_edges.py) and bench/server_edges.py's figures share.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import threading
import time
from pathlib import Path

Address = tuple[str, int]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def connect(address: Address, timeout: float = 10) -> socket.socket:
    return socket.create_connection(address, timeout=timeout)


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Read until the server closes (True) or `within` seconds pass (False); data is skipped."""
    sock.settimeout(0.1 if within >= 0.1 else within)
    deadline = time.monotonic() + within
    while True:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
        if time.monotonic() >= deadline:
            return False


def read_response(sock: socket.socket, timeout: float = 10) -> tuple[int, bytes]:
    """Read one response's head (and whatever came with it); return its status and the bytes."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    return int(data[9:12]), data


def slowloris(address: Address, *, give_up_s: float, gap_s: float = 0.2) -> float | None:
    """Trickle a header block that never ends, one byte every `gap_s`; return the seconds until
    the server closed the connection, or None if it was still open after `give_up_s`."""
    sock = connect(address)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        while time.monotonic() - started < give_up_s:
            try:
                sock.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
            if closed_by_peer(sock, gap_s):
                return time.monotonic() - started
        return None
    finally:
        sock.close()


def header_flood(address: Address, *, clients: int = 4, mib: int = 50) -> list[int | None]:
    """`clients` connections in parallel, each sending `mib` MiB of one header as fast as it
    can; return each one's response status (None: closed without one)."""
    statuses: list[int | None] = []

    def flood() -> None:
        sock = connect(address)
        status: list[int] = []

        def reader() -> None:
            with contextlib.suppress(OSError, AssertionError):
                status.append(read_response(sock)[0])

        t = threading.Thread(target=reader)
        t.start()
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            chunk = b"a" * (1024 * 1024)
            for _ in range(mib):
                if status:
                    break
                sock.sendall(chunk)
        except OSError:
            pass  # refused and closed long before the whole flood
        t.join(15)
        sock.close()
        statuses.append(status[0] if status else None)

    threads = [threading.Thread(target=flood) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


class PeakRss:
    """Sample a process's resident memory in a thread; `peak_kib` is the highest seen."""

    def __init__(self, pid: int, interval_s: float = 0.005) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.before_kib = rss_kib(pid)
        self.peak_kib = self.before_kib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError, AssertionError):
                self.peak_kib = max(self.peak_kib, rss_kib(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grew_mib(self) -> float:
        return (self.peak_kib - self.before_kib) / 1024


def raise_own_nofile(at_least: int) -> None:
    """Let this process hold `at_least` sockets (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < at_least:
        target = at_least if hard == resource.RLIM_INFINITY else min(hard, at_least)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def idle_flood(address: Address, count: int) -> list[socket.socket]:
    """Open `count` connections that send nothing but, for every other one, a partial request
    line (half slowloris); the caller closes them."""
    idle: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.socket()
            sock.settimeout(5)
            sock.connect(address)
            if i % 2:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            idle.append(sock)
    except BaseException:
        for sock in idle:
            sock.close()
        raise
    return idle


def still_open(sockets: list[socket.socket]) -> int:
    """How many of `sockets` the server has not closed, looked at all at once (without
    waiting on any): a closed one reads as end of file or a reset."""
    poller = select.poll()
    by_fd = {}
    for sock in sockets:
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        by_fd[sock.fileno()] = sock
    closed = 0
    for fd, _ in poller.poll(0):
        sock = by_fd[fd]
        try:
            while sock.recv(65536, socket.MSG_DONTWAIT):
                pass  # an answer before the close: read past it
            closed += 1
        except BlockingIOError:
            pass  # data, but the connection is still open
        except ConnectionResetError:
            closed += 1
    return len(sockets) - closed
