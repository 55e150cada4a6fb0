"""Real processes for the server tests: `manage.py serve`, a fast model-server double, and a
PostgreSQL cluster of the test's own (to stop and SIGSTOP without touching a shared one).

The processes are the local launcher's (haru/local/); what is special to this tier is here: a
cluster that starts at once and stops immediately, the single-model layout, and the rule that
CI fails a test it could not run instead of skipping it.
"""

from __future__ import annotations

import os

import pytest

from common.ports import free_port
from haru.local import backing, layouts
from haru.local.processes import wait_for
from haru.local.server import SERVER_VARS, Serve, manage, prepare, server_env, staff_client
from haru.local.upstream import read_request, start_upstream

__all__ = [
    "MODEL",
    "REQUIRED_ENV",
    "SERVER_VARS",
    "OwnPostgres",
    "Serve",
    "free_port_in",
    "layout",
    "manage",
    "own_postgres_possible",
    "prepare",
    "read_request",
    "require_own_postgres",
    "server_env",
    "staff_client",
    "start_upstream",
    "wait_for",
]

MODEL = "edge-model"
# Set by .ci/run (tests/fault reads it too): a test that needs a cluster of its own fails
# where none can run, instead of skipping, so CI cannot go green without having run it.
REQUIRED_ENV = "HARU_FAULT_REQUIRED"


def layout(slug: str, upstream_port: int) -> dict:
    """One static domain serving MODEL from the upstream double."""
    return layouts.single_upstream_layout(slug, MODEL, upstream_port)


def free_port_in(first: int, last: int) -> int:
    """A free port in [first, last]."""
    return free_port(range(first, last + 1))


def own_postgres_possible() -> bool:
    """initdb is here and, as root (PostgreSQL refuses root), a `postgres` user to run it as."""
    return backing.why_no_own_postgres() is None


def require_own_postgres() -> None:
    """Skip where a throwaway PostgreSQL cannot run here; fail instead when REQUIRED_ENV=1."""
    if own_postgres_possible():
        return
    why = "needs PostgreSQL's initdb (and, as root, a postgres user and runuser)"
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1, and this test cannot run here: {why}")
    pytest.skip(why)


class OwnPostgres(backing.OwnPostgres):
    """A throwaway cluster on `port`, running once made; `stop()` is an immediate shutdown
    (what a crashed database looks like to the server)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.init()

    def stop(self, mode: str = "immediate") -> None:
        # The cluster runs with synchronous_commit=off for speed, so an immediate stop would
        # also lose the last few hundred milliseconds of committed work (a login's session
        # row, say), which a production database (synchronous_commit=on) keeps through a crash.
        # A checkpoint first writes the WAL out: the stop then loses connections, not data.
        if mode == "immediate":
            self.sql("CHECKPOINT")
        super().stop(mode)
