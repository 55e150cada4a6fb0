"""Issue 11, finding 12: under ASGI, REST load stays within the connection pool.

With persistent per-thread connections (`conn_max_age=60`) 16-24 concurrent `GET
/v1/fleets/{ref}` for 40 s reached about 95 PostgreSQL connections, "too many clients" and
7-11 % 500s. Here the server runs with a pool of 8 and 24 clients hammer it for a few seconds
while the test counts the server's connections in `pg_stat_activity` (tagged by
`application_name`): never more than the pool, never a 5xx.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from tests.server import harness

pytestmark = [pytest.mark.postgres, pytest.mark.integration, pytest.mark.fault]
POOL_MAX = 8
CLIENTS = 24
SECONDS = 4.0
APP = "haru-pool-test"


def admin_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/postgres", query=""))


@pytest.fixture
def pooled_server(tmp_path):
    base = os.environ["DATABASE_URL"]
    parts = urlsplit(base)
    name = f"{parts.path.lstrip('/') or 'haru'}_pool"
    with psycopg.connect(admin_url(base), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    upstream_port, upstream_loop = harness.start_upstream()
    serve = None
    try:
        url = urlunsplit(parts._replace(path=f"/{name}", query=f"application_name={APP}"))
        env = harness.server_env(tmp_path, DATABASE_URL=url, HARU_DB_POOL_MAX=str(POOL_MAX))
        harness.prepare(env, tmp_path, harness.layout("pool", upstream_port))
        serve = harness.Serve(env, tmp_path)
        yield serve, name
    finally:
        if serve is not None:
            serve.stop()
        upstream_loop.call_soon_threadsafe(upstream_loop.stop)
        with psycopg.connect(admin_url(base), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_24_concurrent_rest_clients_stay_within_the_pool(pooled_server):
    serve, name = pooled_server
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + SECONDS

    def client() -> None:
        with httpx.Client(base_url=serve.url, timeout=30) as http:
            while time.monotonic() < stop_at:
                status = http.get("/v1/fleets/pool").status_code
                with lock:
                    statuses[status] += 1

    peak = 0
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    with psycopg.connect(admin_url(os.environ["DATABASE_URL"]), autocommit=True) as conn:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            count = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                "application_name = %s",
                [name, APP],
            ).fetchone()[0]
            peak = max(peak, count)
            time.sleep(0.05)
    for t in threads:
        t.join()
    assert statuses[200] > CLIENTS, statuses  # the load really ran
    assert set(statuses) == {200}, statuses
    assert 0 < peak <= POOL_MAX, f"{peak} connections for a pool of {POOL_MAX}"
