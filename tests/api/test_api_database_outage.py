"""Issue 11, finding 16: a database outage answers 503 with Retry-After, logged once.

Unit level (any database): the outage is a Django OperationalError raised where the database
is read, in a REST view, a dashboard view and a middleware (the session load). The real
stopped Postgres is in tests/server/test_server_db_outage.py.
"""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.db import IntegrityError, OperationalError
from django.test import Client

from fleets.base import store_outage as outage
from fleets.reads import selectors

pytestmark = pytest.mark.django_db


def refused(*args, **kwargs):
    raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: refused')


@pytest.fixture(autouse=True)
def fresh_log_window(monkeypatch):
    monkeypatch.setattr(outage, "_window", outage._LogWindow())


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


def outage_records(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_rest_answers_503_envelope_with_retry_after(client, api_token, monkeypatch, caplog):
    monkeypatch.setattr(selectors, "fleet_get", refused)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_token}"}
    with caplog.at_level(logging.INFO):
        responses = [client.get("/v1/fleets/demo", **auth) for _ in range(5)]
    for response in responses:
        assert response.status_code == 503
        assert response["Retry-After"] == str(outage.RETRY_AFTER_S)
        assert response.json() == {
            "error": {"code": "database_unavailable", "message": outage.MESSAGE}
        }
        assert b"Traceback" not in response.content
    records = outage_records(caplog)
    # One line for five requests, no traceback, no per-request "Service Unavailable" line.
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].exc_info is None
    assert "database unavailable (OperationalError" in records[0].getMessage()


def test_the_next_report_counts_the_requests_in_between(client, api_token, monkeypatch, caplog):
    monkeypatch.setattr(selectors, "fleet_get", refused)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_token}"}
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            client.get("/v1/fleets/demo", **auth)
        monkeypatch.setattr(outage._window, "last_logged", -outage.LOG_EVERY_S)
        client.get("/v1/fleets/demo", **auth)
    messages = [r.getMessage() for r in outage_records(caplog)]
    assert len(messages) == 2
    assert "(2 more since the last report)" in messages[1]


def test_a_dashboard_page_answers_503_html(client, monkeypatch, caplog):
    staff = User.objects.create_user(
        "ops", password="pw-0123456789", is_staff=True, is_superuser=True
    )
    client.force_login(staff)
    monkeypatch.setattr(SessionStore, "load", refused)  # the session middleware reads it
    with caplog.at_level(logging.INFO):
        response = client.get("/")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert response["Retry-After"] == str(outage.RETRY_AFTER_S)
    assert b"database is unavailable" in response.content
    assert all(r.exc_info is None for r in outage_records(caplog))


def test_a_bug_is_still_a_500(client, api_token, monkeypatch):
    def bug(*args, **kwargs):
        raise IntegrityError("duplicate key value violates unique constraint")

    monkeypatch.setattr(selectors, "fleet_get", bug)
    response = client.get("/v1/fleets/demo", HTTP_AUTHORIZATION=f"Bearer {api_token}")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "Retry-After" not in response
