"""Issue 11, finding 16: the deadline on a web request's database waits (haru/postgres/).

No PostgreSQL needed: a real psycopg `DeadlineConnection` talks to a fake server on a real
socket that completes the start-up and then answers queries; frozen, it reads them and answers
only once thawed (what a SIGSTOPped PostgreSQL looks like from the client: the kernel accepts,
nobody replies until SIGCONT). The frozen real cluster is in tests/server/test_server_db_outage.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time
from types import SimpleNamespace

import psycopg
import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory

from haru.postgres import deadline
from haru.postgres.base import DatabaseWrapper
from haru.postgres.middleware import RequestDeadlineMiddleware

DEADLINE_S = 0.2
# Loose: "ended at about the deadline, did not wait for the frozen server" on a loaded machine.
BOUND_S = 5.0
THAW_ANYWAY_S = 15.0


class FakePostgres:
    """Speaks just enough of the v3 protocol: start-up, then empty queries (held while frozen)."""

    def __init__(self) -> None:
        self.thawed = threading.Event()
        self.thawed.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.queries = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    @staticmethod
    def _message(kind: bytes, body: bytes = b"") -> bytes:
        return kind + struct.pack("!I", len(body) + 4) + body

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:  # SSLRequest / GSSENCRequest: refused; then the StartupMessage
                (length,) = struct.unpack("!I", self._read(conn, 4))
                body = self._read(conn, length - 4)
                if struct.unpack("!I", body[:4])[0] in (80877103, 80877104):
                    conn.sendall(b"N")
                    continue
                break
            params = {
                b"server_version": b"16.0",
                b"client_encoding": b"UTF8",
                b"standard_conforming_strings": b"on",
                b"integer_datetimes": b"on",
                b"DateStyle": b"ISO, MDY",
                b"TimeZone": b"UTC",
            }
            out = self._message(b"R", struct.pack("!I", 0))
            for key, value in params.items():
                out += self._message(b"S", key + b"\0" + value + b"\0")
            out += self._message(b"K", struct.pack("!II", 4242, 1))
            out += self._message(b"Z", b"I")
            conn.sendall(out)
            while True:
                kind = self._read(conn, 1)
                (length,) = struct.unpack("!I", self._read(conn, 4))
                self._read(conn, length - 4)
                if kind == b"X":
                    return
                self.thawed.wait()
                self.queries += 1
                conn.sendall(self._message(b"I") + self._message(b"Z", b"I"))
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def connect(self) -> deadline.DeadlineConnection:
        return deadline.DeadlineConnection.connect(
            host="127.0.0.1",
            port=self.port,
            user="u",
            dbname="d",
            sslmode="disable",
            gssencmode="disable",
            connect_timeout=5,
            autocommit=True,
        )

    def freeze(self) -> None:
        self.thawed.clear()
        # Thawed by itself later: without the deadline, a test fails instead of hanging.
        threading.Timer(THAW_ANYWAY_S, self.thaw).start()

    def thaw(self) -> None:
        self.thawed.set()

    def close(self) -> None:
        self.thaw()
        self.listener.close()


@pytest.fixture
def pg():
    server = FakePostgres()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def fresh_breaker(monkeypatch):
    monkeypatch.setattr(deadline, "BREAKER", deadline.Breaker())


def test_a_query_the_database_never_answers_ends_at_the_deadline_and_closes_the_connection(pg):
    conn = pg.connect()
    conn.execute("")  # healthy first
    pg.freeze()
    started = time.monotonic()
    with deadline.scope(DEADLINE_S), pytest.raises(deadline.DatabaseNotAnswering) as raised:
        conn.execute("")
    assert time.monotonic() - started < BOUND_S
    assert "did not answer within 200 ms" in str(raised.value)
    assert isinstance(raised.value, psycopg.OperationalError)
    # Its query may still run when the server thaws: never lent again.
    assert conn.closed and conn.cut_by_deadline


def test_outside_a_web_request_a_wait_has_no_deadline(pg):
    conn = pg.connect()
    pg.freeze()
    done = threading.Event()

    def query() -> None:  # a migration, a tick, the chat proxy's store thread
        conn.execute("")
        done.set()

    threading.Thread(target=query, daemon=True).start()
    # Far past the 0.2 s a web request gets: still waiting, the connection open.
    assert not done.wait(6 * DEADLINE_S)
    assert not conn.closed
    pg.thaw()
    assert done.wait(BOUND_S)
    assert not conn.closed


def test_a_healthy_wait_inside_a_request_is_answered_as_before(pg):
    conn = pg.connect()
    with deadline.scope(DEADLINE_S):
        for _ in range(3):
            conn.execute("")
    assert pg.queries == 3
    assert deadline.BREAKER.tripped_at is None
    assert not conn.closed


def test_after_one_deadline_other_requests_fail_fast_until_the_probe_gets_an_answer(pg):
    first, probe_conn, other = pg.connect(), pg.connect(), pg.connect()
    pg.freeze()
    with deadline.scope(DEADLINE_S), pytest.raises(deadline.DatabaseNotAnswering):
        first.execute("")
    assert deadline.BREAKER.tripped_at is not None
    probing = threading.Event()
    probe_result: list[BaseException | None] = []

    def probe() -> None:
        with deadline.scope(30.0):
            deadline.admit()  # the next request to arrive is the one that tries
            probing.set()
            try:
                probe_conn.execute("")
                probe_result.append(None)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                probe_result.append(exc)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    assert probing.wait(BOUND_S)
    # Any other request: refused at once, not after its 30 s, and its connection closed (never
    # left for Django to check with a query of its own, outside the deadline).
    started = time.monotonic()
    with deadline.scope(30.0), pytest.raises(deadline.DatabaseNotAnswering) as raised:
        other.execute("")
    with deadline.scope(30.0), pytest.raises(deadline.DatabaseNotAnswering):
        deadline.admit()
    assert time.monotonic() - started < BOUND_S
    assert "failing fast" in str(raised.value)
    assert other.closed
    # SIGCONT: the probe's query is answered, and every request may use the database again.
    pg.thaw()
    thread.join(BOUND_S)
    assert probe_result == [None]
    assert deadline.BREAKER.tripped_at is None
    with deadline.scope(DEADLINE_S):
        deadline.admit()
        pg.connect().execute("")


def test_a_request_whose_deadline_passed_fails_its_other_waits_at_once(pg):
    frozen_conn, other = pg.connect(), pg.connect()
    pg.freeze()
    with deadline.scope(DEADLINE_S):
        with pytest.raises(deadline.DatabaseNotAnswering):
            frozen_conn.execute("")
        pg.thaw()
        # The database answers others now, but this request's answer is already 503.
        with pytest.raises(deadline.DatabaseNotAnswering):
            other.execute("")


def test_a_success_outside_web_requests_also_ends_fail_fast(pg):
    conn = pg.connect()
    pg.freeze()
    with deadline.scope(DEADLINE_S), pytest.raises(deadline.DatabaseNotAnswering):
        conn.execute("")
    pg.thaw()
    pg.connect().execute("")  # e.g. the reconcile loop's thread, after the thaw
    assert deadline.BREAKER.tripped_at is None


def test_the_breaker_says_once_how_long_the_database_was_away(caplog):
    now = [100.0]
    breaker = deadline.Breaker(clock=lambda: now[0])
    stuck, waiting, probe = (deadline.RequestBudget(1.0) for _ in range(3))
    breaker.trip(stuck)
    breaker.admit(probe)
    for _ in range(4):
        with pytest.raises(deadline.DatabaseNotAnswering):
            breaker.admit(waiting)
    now[0] = 112.5
    with caplog.at_level(logging.INFO, logger="haru.database"):
        breaker.answered()
        breaker.answered()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "database answering again, 12.5 s after a request's deadline passed; "
        "4 requests failed fast meanwhile"
    ]
    breaker.admit(waiting)  # closed: everyone waits as usual


def test_the_probe_ending_lets_the_next_request_try():
    breaker = deadline.Breaker()
    probe, nxt = deadline.RequestBudget(1.0), deadline.RequestBudget(1.0)
    breaker.trip(deadline.RequestBudget(1.0))
    breaker.admit(probe)
    with pytest.raises(deadline.DatabaseNotAnswering):
        breaker.admit(nxt)
    breaker.release(probe)  # its request ended (a 503 from the pool's timeout, say)
    breaker.admit(nxt)


def test_django_fails_fast_before_queueing_for_a_pooled_connection(settings):
    # A backend whose pool would wait on an unreachable host: admit() refuses first.
    wrapper = DatabaseWrapper(
        {
            **settings.DATABASES["default"],
            "ENGINE": "haru.postgres",
            "NAME": "haru",
            "HOST": "db.invalid",
            "OPTIONS": {"pool": {"min_size": 1, "timeout": 30}},
            "CONN_HEALTH_CHECKS": True,
            "CONN_MAX_AGE": 0,
            "TIME_ZONE": None,
            "AUTOCOMMIT": True,
        },
        alias="deadline-test",
    )
    deadline.BREAKER.trip(deadline.RequestBudget(1.0))
    with deadline.scope(1.0):
        deadline.admit()  # this one probes
        started = time.monotonic()
        # ensure_connection() without pytest-django's guard (no database is touched).
        with (
            deadline.scope(1.0),
            pytest.raises(OperationalError, match="failing fast"),
            wrapper.wrap_database_errors,
        ):
            wrapper.connect()
    assert time.monotonic() - started < 2.0
    assert "deadline-test" not in DatabaseWrapper._connection_pools


def test_the_middleware_scopes_each_request_sync_and_async(settings):
    settings.HARU = {**settings.HARU, "db_request_deadline_ms": 1500}
    seen: list[float | None] = []

    def view(request):
        budget = deadline.current()
        seen.append(budget.wait_s if budget else None)
        return HttpResponse("ok")

    async def async_view(request):
        # What sync_to_async gives the sync code under ASGI: a copy of this context.
        return await asyncio.to_thread(view, request)

    request = RequestFactory().get("/v1/fleets")
    assert RequestDeadlineMiddleware(view)(request).status_code == 200
    response = asyncio.run(RequestDeadlineMiddleware(async_view)(request))
    assert response.status_code == 200
    assert seen == [1.5, 1.5]
    assert deadline.current() is None  # nothing leaks past the request


def test_the_pools_warning_for_a_connection_the_deadline_closed_is_dropped():
    cut, other = SimpleNamespace(cut_by_deadline=True), SimpleNamespace()
    quiet = deadline.CutConnectionFilter()
    record = logging.LogRecord(
        "psycopg.pool",
        logging.WARNING,
        __file__,
        1,
        "discarding closed connection: %s",
        (cut,),
        None,
    )
    assert not quiet.filter(record)
    record.args = (other,)
    assert quiet.filter(record)
