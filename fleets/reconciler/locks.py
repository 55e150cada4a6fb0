"""One tick per fleet at a time, across threads, processes and machines.

PostgreSQL: a session-level advisory lock keyed by the fleet. It lives on the tick's own
database connection, so a worker that dies (or is killed by Celery's hard time limit) drops
its connection and the lock with it: nothing to expire, nothing to clean up.
SQLite (the embedded default, one host): an flock on a file under the var dir, which the kernel
releases when the holder dies.

The lock only avoids duplicate supervisor calls and wasted work; correctness never depends on
it, because every state change is a conditional UPDATE.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from django.conf import settings
from django.db import connection

from fleets.models import Id

_POLL_S = 0.05


def _advisory_key(fleet_id: Id) -> int:
    # A signed 64-bit key from the fleet id; a stable namespace prefix keeps clear of other
    # users of advisory locks in the same database.
    digest = hashlib.blake2b(f"haru.tick:{fleet_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextlib.contextmanager
def _pg_lock(fleet_id: Id, wait_s: float) -> Iterator[bool]:
    key = _advisory_key(fleet_id)
    deadline = time.monotonic() + wait_s
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
            got = cursor.fetchone()[0]
            if got or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
    try:
        yield bool(got)
    finally:
        if got:
            with contextlib.suppress(Exception), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def _lock_dir() -> Path:
    path = Path(settings.VAR_DIR) / "locks"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _file_lock(fleet_id: Id, wait_s: float) -> Iterator[bool]:
    fd = os.open(_lock_dir() / f"tick-{fleet_id}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    got = False
    try:
        while True:
            try:
                # flock locks belong to the open file description: two threads of one process
                # exclude each other as two processes do.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
            except BlockingIOError:
                got = False
            if got or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        yield got
    finally:
        if got:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def fleet_tick_lock(fleet_id: Id, *, wait_s: float = 0.0) -> AbstractContextManager[bool]:
    """Hold the fleet's tick lock; yields whether it was acquired within `wait_s`."""
    if connection.vendor == "postgresql":
        return _pg_lock(fleet_id, wait_s)
    return _file_lock(fleet_id, wait_s)
