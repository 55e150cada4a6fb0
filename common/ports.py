"""Free TCP ports for the servers the local launcher (haru/local/) and the GPU host's benchmark
start, outside the ephemeral range. Standard library only, in `common/` because the GPU truth
run (bench/gpu_truth.py) uses it on a host that carries only the supervisor and `common/`.

Binding port 0 asks the kernel for a port from its ephemeral range, the range it also draws the
source port of every outgoing connection from. Between that probe and the server's own bind,
any connection made on the machine (a Celery worker's to Postgres, a test's to a supervisor)
can be given the same port, and the server then exits with "address already in use": seen in
CI as a supervisor that never answered. Ports below the range are never handed out that way;
only another listener can take them, and this process hands each port out once.

The one place in the project that probes a port by binding it (tests/tools checks that).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

# Below this the well-known and registered services this project runs live (Postgres, Redis,
# the demo's ports).
FIRST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)

_given: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """Return the kernel's range for outgoing connections' source ports (Linux's default
    elsewhere)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def candidates() -> range:
    """Return the ports `free_port` draws from: the widest stretch at or above FIRST outside
    the range."""
    low, high = ephemeral_range()
    below = range(FIRST, low) if low > FIRST else range(0)
    above = range(max(high + 1, FIRST), 65536)
    return max(below, above, key=len)


def free_port(within: range | None = None) -> int:
    """Return a port nobody listens on, outside the ephemeral range (or in `within`), not
    handed out before."""
    pool = candidates() if within is None else within
    with _lock:
        for _ in range(200):
            port = random.choice(pool) if pool else _kernel_port()
            # Strict (no SO_REUSEADDR): a port with connections still in TIME_WAIT is passed
            # over too.
            if port in _given or not _binds(port, reuse=False):
                continue
            _given.add(port)
            return port
    raise AssertionError(f"no free port found in {pool.start}-{pool.stop - 1}")


def port_free(port: int) -> bool:
    """Whether a server could listen on `port` now (as servers bind: with SO_REUSEADDR, so a
    closed listener's TIME_WAIT connections do not count)."""
    return _binds(port, reuse=True)


def _binds(port: int, *, reuse: bool) -> bool:
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
