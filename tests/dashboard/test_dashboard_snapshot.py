"""Every part of a page comes from one snapshot of the state.

Two seconds after a crash, one frame of the fleet page showed the new active in its header while
the in-flight panel still showed `probe`: the page was a dozen autocommit queries, each reading a
later moment than the one before. The fleet page and the overview now read inside one
transaction (`fleets.reads.snapshot.consistent_read`)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from fleets.base import clock
from fleets.dashboard import selectors
from fleets.dashboard.selectors import fleet_page, overview_rows
from fleets.models import Fleet
from tests.dashboard.failover_steps import commit_switch, promotion_at_probe


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("build", [fleet_page, overview_rows])
def test_every_query_of_a_page_runs_in_one_transaction(seeded_fleet, build):
    promotion_at_probe(seeded_fleet)
    outside: list[str] = []
    statements: list[str] = []

    def watch(execute, sql, params, many, context):
        statements.append(sql)
        if not connection.in_atomic_block and not sql.startswith(("BEGIN", "SET TRANSACTION")):
            outside.append(sql)
        return execute(sql, params, many, context)

    now = clock.now()
    with connection.execute_wrapper(watch):
        if build is fleet_page:
            fleet_page(seeded_fleet, now=now)
        else:
            overview_rows(now=now)

    assert len(statements) > 5
    assert outside == []


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_the_snapshot_takes_no_write_lock(seeded_fleet, settings):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's transaction mode")
    begins: list[str] = []

    def watch(execute, sql, params, many, context):
        if sql.startswith("BEGIN"):
            begins.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        fleet_page(seeded_fleet, now=clock.now())
    # The page's read is DEFERRED (no write lock: the reconciler never waits for a render);
    # writes keep the configured IMMEDIATE.
    assert begins == ["BEGIN DEFERRED"]
    assert connection.transaction_mode == "IMMEDIATE"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_failover_committing_while_the_page_is_built_does_not_mix_into_it(
    seeded_fleet, monkeypatch
):
    """The switch commits after the cards were read and before the operation and the timeline
    are: the page shows the state before it, every part of it."""
    op, west = promotion_at_probe(seeded_fleet)
    east_id = seeded_fleet.active_domain_id
    revision = Fleet.objects.get(pk=seeded_fleet.pk).route_revision

    def failover_commits() -> None:
        try:
            commit_switch(seeded_fleet, op, west, east_id, revision)
        finally:
            connection.close()

    read_backoffs = selectors.failover_backoff_state

    def interleaved(*args, **kwargs):
        writer = threading.Thread(target=failover_commits)
        writer.start()
        writer.join(timeout=30)
        return read_backoffs(*args, **kwargs)

    monkeypatch.setattr(selectors, "failover_backoff_state", interleaved)
    page = fleet_page(seeded_fleet, now=clock.now())

    # The failover did commit ...
    assert Fleet.objects.get(pk=seeded_fleet.pk).active_domain_id == west.id
    # ... and the page is the moment before it, in every part.
    assert page["fleet"]["active_slug"] == "east"
    assert page["fleet"]["route_revision"] == revision
    assert {d["slug"]: d["role"] for d in page["domains"]} == {"east": "active", "west": "standby"}
    assert page["operation"]["current_step"] == "probe"
    assert {s["name"]: s["status"] for s in page["operation"]["steps"]}["probe"] == "running"
    kinds = {e["kind"] for e in page["events"]}
    assert "fleet.route.switched" not in kinds
    assert page["last_event_id"] == max(e["id"] for e in page["events"])
