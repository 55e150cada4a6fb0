"""Django's PostgreSQL backend, failing fast before the pool's queue while the database is frozen
or unreachable.

ENGINE "haru.postgres" (haru/settings.py); everything else is Django's own backend.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base
from psycopg import IsolationLevel

from haru.postgres import deadline, reachability
from haru.postgres.deadline import DeadlineConnection


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        # Inside a web request while the database is frozen: fail now rather than wait for the
        # pool to lend a connection (deadline.py, Breaker).
        deadline.admit()
        pool = self.pool  # type: ignore[attr-defined]  # Django 5.1's pool, not in the stubs
        if (
            pool is None
            or deadline.current() is None
            or "isolation_level" in self.settings_dict["OPTIONS"]
        ):
            return super().get_new_connection(conn_params)
        # A web request while the database may be unreachable (reachability.py): 503 at once,
        # or this request probes; then the pool's lending, given up once an attempt fails.
        if not reachability.REACHABILITY.admit():
            reachability.probe(pool, DeadlineConnection.connect)
        pool.open()
        connection = reachability.REACHABILITY.lend(pool)
        # What Django's own get_new_connection does after getconn() when OPTIONS names no
        # isolation level (fleets/base/private_apis.py checks that it still does).
        self.isolation_level = IsolationLevel.READ_COMMITTED
        return connection
