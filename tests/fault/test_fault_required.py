"""The fault suite's tool check: a skip on a developer's machine, a failure where CI requires it."""

from __future__ import annotations

import pytest

from tests.fault import cluster
from tests.server import harness


@pytest.fixture
def no_initdb(monkeypatch):
    monkeypatch.setattr(cluster, "PG_BIN", None)


def test_missing_tools_skip_the_suite_by_default(no_initdb, monkeypatch):
    monkeypatch.delenv(cluster.REQUIRED_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb"):
        cluster.require_tools()


def test_missing_tools_fail_the_suite_where_it_is_required(no_initdb, monkeypatch):
    monkeypatch.setenv(cluster.REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="HARU_FAULT_REQUIRED=1.*initdb"):
        cluster.require_tools()


def test_present_tools_neither_skip_nor_fail(monkeypatch):
    monkeypatch.setenv(cluster.REQUIRED_ENV, "1")
    monkeypatch.setattr(cluster, "tools_missing", lambda: None)
    cluster.require_tools()


def test_the_server_tests_own_postgres_follows_the_same_variable(monkeypatch):
    """tests/server's fault tests (a frozen, a stopped PostgreSQL of their own) obey it too."""
    assert harness.REQUIRED_ENV == cluster.REQUIRED_ENV
    monkeypatch.setattr(harness, "own_postgres_possible", lambda: False)
    monkeypatch.delenv(harness.REQUIRED_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="initdb"):
        harness.require_own_postgres()
    monkeypatch.setenv(harness.REQUIRED_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="HARU_FAULT_REQUIRED=1.*initdb"):
        harness.require_own_postgres()
