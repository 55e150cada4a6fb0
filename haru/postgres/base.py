"""Django's PostgreSQL backend, failing fast before the pool's queue while the database is frozen.

ENGINE "haru.postgres" (haru/settings.py); everything else is Django's own backend.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from haru.postgres import deadline


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        # Inside a web request while the database is frozen: fail now rather than wait for the
        # pool to lend a connection (deadline.py, Breaker).
        deadline.admit()
        return super().get_new_connection(conn_params)
