"""Issue 29: with PostgreSQL unreachable, web requests are answered 503 at once, not after the
pool timeout, and /metrics serves what needs no database (haru/postgres/reachability.py,
fleets/metrics/scrape.py).

No PostgreSQL needed: a port nothing listens on is a stopped database (connections refused), and
the fake server of test_server_request_deadline.py is one that accepts. The real stopped
cluster is in test_server_db_outage.py; the figures in bench/stopped_database.py.
"""

from __future__ import annotations

import logging
import socket

import psycopg
import pytest
from django.db import OperationalError
from psycopg_pool import ConnectionPool

from fleets.metrics import scrape
from haru.postgres import reachability
from haru.postgres.deadline import DeadlineConnection
from haru.postgres.reachability import PROBE_EVERY_S, DatabaseUnreachable, Reachability
from tests.server.test_server_request_deadline import FakePostgres


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fresh(monkeypatch, clock):
    """This test's own reachability (the module's is shared by the whole process)."""
    state = Reachability(clock)
    monkeypatch.setattr(reachability, "REACHABILITY", state)
    return state


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _params(port: int) -> dict:
    return {
        "host": "127.0.0.1",
        "port": port,
        "user": "u",
        "dbname": "d",
        "sslmode": "disable",
        "gssencmode": "disable",
        "connect_timeout": 2,
        "autocommit": True,
    }


def test_a_refused_connection_makes_the_database_unreachable_and_one_that_opens_ends_it(fresh):
    with pytest.raises(psycopg.OperationalError):
        DeadlineConnection.connect(**_params(_closed_port()))
    assert fresh.down_since is not None
    assert "refused" in fresh.reason
    pg = FakePostgres()
    try:
        DeadlineConnection.connect(**_params(pg.port)).close()
    finally:
        pg.close()
    assert fresh.down_since is None


def test_while_unreachable_one_request_a_second_probes_and_the_others_are_refused(fresh, clock):
    assert fresh.admit() is True  # reachable: everyone goes on
    fresh.failed(ConnectionRefusedError("connection refused"))
    with pytest.raises(DatabaseUnreachable, match="connection refused"):
        fresh.admit()
    clock.now += PROBE_EVERY_S
    assert fresh.admit() is False  # this one probes
    with pytest.raises(DatabaseUnreachable):
        fresh.admit()  # and only that one
    fresh.opened()
    assert fresh.admit() is True


def test_a_request_waiting_for_the_pool_gives_up_once_the_pool_cannot_connect(fresh):
    # The pool's own attempt is refused: the request is told that, not the pool's timeout.
    params = _params(_closed_port())
    conninfo = psycopg.conninfo.make_conninfo(
        **{k: v for k, v in params.items() if k != "autocommit"}
    )
    pool = ConnectionPool(
        conninfo,
        min_size=1,
        timeout=30,
        open=True,
        connection_class=DeadlineConnection,
        reconnect_timeout=60,
    )
    try:
        with pytest.raises(DatabaseUnreachable, match="unreachable"):
            fresh.lend(pool)
    finally:
        pool.close(timeout=1)


def test_a_probe_that_cannot_connect_raises_unreachable(fresh):
    pool = ConnectionPool(
        psycopg.conninfo.make_conninfo(host="127.0.0.1", port=_closed_port(), connect_timeout=2),
        open=False,
        connection_class=DeadlineConnection,
    )
    with pytest.raises(DatabaseUnreachable):
        reachability.probe(pool, DeadlineConnection.connect)
    assert fresh.down_since is not None


def test_a_scrape_stops_reading_the_store_at_the_first_outage_and_logs_no_traceback(caplog):
    calls: list[str] = []

    def down() -> None:
        calls.append("down")
        raise OperationalError("connection refused")

    def never() -> str:
        calls.append("never")
        return "read"

    caplog.set_level(logging.WARNING)
    with scrape.scope():
        assert scrape.read_store("fleet state", down) is None
        assert scrape.read_store("step history", never) is None
    assert calls == ["down"]
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    with scrape.scope():  # the next scrape tries again
        assert scrape.read_store("step history", never) == "read"


def test_a_collector_bug_is_logged_with_its_traceback_and_skips_only_that_collector(caplog):
    def broken() -> None:
        raise KeyError("a bug")

    with scrape.scope():
        assert scrape.read_store("GPU plan", broken) is None
        assert scrape.read_store("readiness", lambda: "read") == "read"
    assert any(r.exc_info for r in caplog.records if "GPU plan unreadable" in r.getMessage())


@pytest.mark.django_db
def test_every_database_collector_reads_the_store_through_the_scrape(caplog):
    # A collector that read the store on its own logged a traceback per scrape with PostgreSQL
    # stopped, and (on a pool) waited the pool's timeout: each goes through scrape.read_store,
    # so one outage ends the whole scrape's reads, quietly.
    from django.db import connection  # noqa: PLC0415

    from fleets.metrics import database_collectors  # noqa: PLC0415

    queries: list[str] = []

    def refused(execute, sql, params, many, context):
        queries.append(sql)
        raise OperationalError("connection refused")

    caplog.set_level(logging.WARNING)
    collectors = database_collectors()
    with connection.execute_wrapper(refused), scrape.scope():
        served = [m.name for collector in collectors for m in collector.collect()]
    assert served == ["haru_state_store_up"]  # saying what it cannot serve
    assert len(queries) == 1, queries
    assert not any(r.exc_info for r in caplog.records), caplog.text
