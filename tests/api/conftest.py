"""Fixtures and assertions shared by the API tests."""

from __future__ import annotations

import pytest


def assert_envelope(response, status: int, code: str) -> dict:
    """Assert `response` is the JSON error envelope with `status` and `code`; return the error."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].split(";")[0] == "application/json"
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) <= {"code", "message", "operation"}, error
    return error


@pytest.fixture
def envelope():
    """Return the envelope assertion (a fixture: test modules here are not importable)."""
    return assert_envelope


@pytest.fixture
def client_with_token(api_client, api_token):
    """An API client presenting the configured bearer token."""
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token}")
    return api_client
