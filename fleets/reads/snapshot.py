"""One consistent read: every query inside sees the database as of one moment.

A page built from a dozen autocommit queries mixes moments: two seconds after a crash, one
frame of the fleet page showed the new active in its header while the in-flight panel still
showed `probe`. Inside `consistent_read()` the queries share one transaction whose snapshot is
taken at its first read, so the page is the state between two commits, never across one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def consistent_read() -> Iterator[None]:
    """Run the reads inside on one snapshot of the database; they must not write."""
    if connection.in_atomic_block:
        # Already in a transaction (a caller's, or a test's): its snapshot is the one.
        yield
        return
    if connection.vendor == "sqlite":
        # The settings open SQLite transactions IMMEDIATE (writers queue instead of failing),
        # which takes the write lock: a page render would hold up the reconciler. A read needs
        # only a DEFERRED begin: in WAL mode it reads one snapshot from its first read on, and
        # no writer waits for it.
        connection.ensure_connection()
        mode = getattr(connection, "transaction_mode", None)
        connection.transaction_mode = "DEFERRED"  # type: ignore[attr-defined]
        try:
            with transaction.atomic():
                connection.transaction_mode = mode  # type: ignore[attr-defined]
                yield
        finally:
            connection.transaction_mode = mode  # type: ignore[attr-defined]
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # READ COMMITTED takes a snapshot per statement; one for the whole transaction:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
