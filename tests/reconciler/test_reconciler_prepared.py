"""The idle tick's statements are prepared on PostgreSQL (fleets/base/prepared.py): planned once
per connection, not on every tick; and never where they should not be."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleets.base import prepared
from fleets.reconciler.tick import tick_run

pytestmark = pytest.mark.django_db


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.postgres
def test_the_idle_ticks_reads_and_lease_are_prepared_after_a_few_ticks(fleet, fake_clock):
    for _ in range(8):
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran
        fake_clock.advance(ms=50)
    statements = _prepared_statements()
    assert any('UPDATE "fleets_lease" SET previous_holder' in s for s in statements), statements
    assert any('UPDATE "fleets_lease" SET holder' in s for s in statements), statements
    assert any('FROM "fleets_fleet"' in s for s in statements), statements
    assert any('FROM "fleets_slot"' in s for s in statements), statements


@pytest.mark.postgres
def test_nothing_is_prepared_when_the_setting_turns_it_off(fleet, fake_clock, monkeypatch):
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "prepare_threshold", None)
    before = set(_prepared_statements())
    for _ in range(8):
        assert tick_run(fleet_id=fleet.id, poll_s=0).ran
        fake_clock.advance(ms=50)
    assert set(_prepared_statements()) == before


@pytest.mark.postgres
def test_a_logged_statement_keeps_its_text():
    # DEBUG or a test's capture: the plain cursor, whose statements the log can show.
    with CaptureQueriesContext(connection) as queries:
        for _ in range(7):
            with prepared.cursor() as cursor:
                cursor.execute("SELECT %s::int", [1])
    assert [q["sql"] for q in queries] == ["SELECT 1::int"] * 7


def test_sqlite_and_every_other_backend_get_django_s_own_cursor():
    if connection.vendor == "postgresql":
        pytest.skip("the embedded default's case")
    with prepared.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
