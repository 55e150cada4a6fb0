"""A cursor for the statements the reconcile loop runs hundreds of times a second.

Django's PostgreSQL backend binds parameters on the client (psycopg's `ClientCursor`), so the
server parses and plans every statement again. An idle tick's four snapshot reads and its
lease's take and give-back run once per fleet per interval (200 times a second at 1,000 fleets
on a 5 s interval), and planning them cost the server more than running them (the snapshot's
fleet query plans in about 0.8 ms and runs in 0.2). On PostgreSQL these statements go through a
cursor that binds on the server, which psycopg prepares once a connection has run the same
statement five times (`prepare_threshold`, which haru/settings.py sets; Django's default, None,
prepares nothing): from then on the session keeps its plan (psycopg names the last 100 per
connection). Django's own client-binding cursors never prepare, so nothing else changes. The
loop's threads keep their pooled connections, so the plans stay with them.

The cursor is Django's own wrapper around it, so errors are Django's. With
`HARU_DB_PREPARED_STATEMENTS=false` (behind a pooler in transaction mode that cannot carry
prepared statements), on SQLite, and while Django logs every statement (`HARU_DEBUG`, a test's
query capture), it is Django's plain cursor.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.postgresql.psycopg_any import register_tzloader  # type: ignore[import-untyped]
from psycopg.postgres import types
from psycopg.pq import Format

_TIMESTAMPTZ_OID = types["timestamptz"].oid


def cursor(alias: str = DEFAULT_DB_ALIAS) -> Any:
    """A cursor of `alias` (a context manager, as `connection.cursor()`) whose statements the
    server prepares after a few runs; Django's plain cursor where that does not apply."""
    db = connections[alias]
    if (
        db.vendor != "postgresql"
        or db.settings_dict["OPTIONS"].get("prepare_threshold") is None
        # Logging each statement (DEBUG, a test's capture): psycopg keeps no text of a
        # prepared statement's run for the log, so these statements are not prepared then.
        or db.queries_logged
    ):
        return db.cursor()
    # What BaseDatabaseWrapper.cursor() does, with a server-binding cursor in place of the
    # backend's client-binding one.
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    with db.wrap_database_errors:
        raw = psycopg.Cursor(db.connection)
        loader = db.connection.adapters.get_loader(_TIMESTAMPTZ_OID, Format.TEXT)
        if db.timezone != getattr(loader, "timezone", db.timezone):
            register_tzloader(db.timezone, raw)
    return db.make_cursor(raw)  # type: ignore[arg-type]  # the stubs name the wrapper, not the DB-API cursor it wraps
