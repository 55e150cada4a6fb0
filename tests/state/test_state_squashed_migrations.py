"""The fleets migrations of 30 November to 4 December 2026 are one squashed migration.

A new database gets it whole; a database that applied all fourteen counts it as applied; a
database part of the way through is refused by `migrate` (system check haru.E003) before
anything changes, with the commit to upgrade it from.
"""

from __future__ import annotations

import importlib

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

SQUASHED = importlib.import_module("fleets.migrations.0001_squashed_0014").Migration


def _e003() -> list:
    return [m for m in run_checks(databases=["default"]) if m.id == "haru.E003"]


@pytest.mark.django_db
def test_a_database_migrated_from_scratch_records_the_squash_and_all_it_replaces():
    applied = {
        name for app, name in MigrationRecorder(connection).applied_migrations() if app == "fleets"
    }
    assert {name for _, name in SQUASHED.replaces} | {"0001_squashed_0014"} <= applied
    loader = MigrationLoader(connection)
    assert ("fleets", "0001_squashed_0014") in loader.applied_migrations
    assert _e003() == []


@pytest.mark.django_db
def test_a_database_part_of_the_way_through_is_refused_with_the_commit_to_upgrade_from():
    later = [name for _, name in SQUASHED.replaces][9:]  # as if it stopped at 0009_drills
    MigrationRecorder.Migration.objects.filter(app="fleets", name__in=later).delete()
    MigrationRecorder.Migration.objects.filter(app="fleets", name="0001_squashed_0014").delete()
    [error] = _e003()
    assert "at 0009_drills" in error.msg
    assert "0014_domain_provider_from_driver_registry" in error.msg
    assert "9645153" in error.hint
