"""The connection cap against the process's open-file limit (resource limits faked)."""

from __future__ import annotations

import logging

import pytest

from fleets.server import limits as edge_limits

BASE = edge_limits.EdgeLimits(
    header_timeout_s=10,
    body_timeout_s=60,
    keepalive_timeout_s=5,
    max_header_bytes=65536,
    max_headers=100,
    max_body_bytes=33 * 1024 * 1024,
    max_connections=2048,
    max_connections_per_address=256,
)


@pytest.fixture
def rlimit(monkeypatch):
    state = {"soft": 1024, "hard": 1024, "set": []}

    def getrlimit(which):
        return state["soft"], state["hard"]

    def setrlimit(which, pair):
        if pair[0] > state["hard"]:
            raise ValueError("not allowed to raise maximum limit")
        state["soft"] = pair[0]
        state["set"].append(pair)

    monkeypatch.setattr(edge_limits.resource, "getrlimit", getrlimit)
    monkeypatch.setattr(edge_limits.resource, "setrlimit", setrlimit)
    return state


def test_the_soft_limit_is_raised_to_fit_the_cap(rlimit):
    rlimit["hard"] = 1_048_576
    assert edge_limits.fit_descriptors(BASE) == BASE
    assert rlimit["soft"] == 2048 * 2 + 256


def test_the_cap_is_lowered_with_a_warning_when_the_hard_limit_is_too_low(rlimit, caplog):
    rlimit["soft"] = rlimit["hard"] = 1024
    with caplog.at_level(logging.WARNING):
        fitted = edge_limits.fit_descriptors(BASE)
    assert fitted.max_connections == (1024 - 256) // 2
    assert "capping client connections at 384" in caplog.text


def test_a_limit_that_already_fits_is_left_alone(rlimit):
    rlimit["soft"] = rlimit["hard"] = 100_000
    assert edge_limits.fit_descriptors(BASE) == BASE
    assert rlimit["set"] == []
