"""Fixtures for end-to-end tests: two real simulated hosts and a fleet over them."""

from __future__ import annotations

import json
import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from fleets.layouts.loader import parse_layout
from fleets.models import Fleet
from fleets.services.layouts import layout_apply
from haru.local import ticks
from tests.e2e.harness import (
    TOKEN,
    ServerProc,
    SimHost,
    fleet_layout,
    put_in_standby_posture,
    wait_for,
)


@pytest.fixture
def make_hosts(tmp_path):
    """Return a factory of (east, west): east serving, west asleep with its trainer running."""
    started: list[SimHost] = []

    def make(*, east: dict | None = None, west: dict | None = None, west_token: str | None = None):
        e = SimHost("east", tmp_path, **(east or {}))
        w = SimHost("west", tmp_path, start_asleep=True, **(west or {}))
        started.extend([e, w])
        e.start()
        w.start(token=west_token)
        if west_token is None:
            put_in_standby_posture(w)
        return e, w

    yield make
    for host in started:
        host.crash()  # SIGKILL everything: a graceful stop would wait out hung engines


@pytest.fixture
def supervisor_token(settings):
    settings.HARU = {**settings.HARU, "supervisor_token": TOKEN}
    return TOKEN


@pytest.fixture
def make_fleet(db, supervisor_token):
    """Return a function seeding a fleet over (east, west) in the test database."""

    def make(east: SimHost, west: SimHost, policy: dict | None = None) -> Fleet:
        data = fleet_layout(east, west, policy)
        layout_apply(layout=parse_layout(data))
        return Fleet.objects.get(slug=data["slug"])

    return make


@pytest.fixture
def drive():
    """Return `drive(fleet, until, timeout)`: tick the fleet until `until()` is truthy."""

    def run(fleet, until, timeout: float = 20.0, poll_s: float = 0.5):
        return ticks.drive(fleet.id, until, timeout, poll_s)

    return run


@pytest.fixture
def server_db():
    """Return the server's DATABASE_URL env (empty for the embedded SQLite); drop it after."""
    base = os.environ.get("DATABASE_URL") or ""
    if not base.startswith("postgres"):
        yield {}
        return

    name = f"haru_e2e_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(base)
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield {"DATABASE_URL": urlunsplit(parts._replace(path=f"/{name}"))}
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def served(tmp_path, make_hosts, server_db):
    """Return a function starting (east, west, server) with a seeded fleet `e2e`."""
    servers: list[ServerProc] = []

    def start(
        policy: dict | None = None,
        serve_args=(),
        server_env=None,
        engine: str | None = None,
        **host_kwargs,
    ):
        east, west = make_hosts(**host_kwargs)
        server = ServerProc(tmp_path, env={**server_db, **(server_env or {})})
        servers.append(server)
        layout = tmp_path / "layout.json"
        layout.write_text(json.dumps(fleet_layout(east, west, policy, engine=engine)))
        server.manage("migrate", "--noinput", "-v0")
        server.manage("seed_layout", "--config", str(layout))
        server.start(*serve_args)
        wait_for(
            lambda: all(
                d["lastSeenAt"] for d in server.api("GET", "/fleets/e2e").json()["domains"]
            ),
            15,
            "heartbeats",
        )
        return east, west, server

    yield start
    for server in servers:
        server.kill()
