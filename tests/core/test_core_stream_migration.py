"""When a planned promotion moves long streams (a drain bound) and when it drains in full."""

from __future__ import annotations

import pytest

from fleets.core.stream_migration import drain_bound, engine_of

ALLOWED = {
    "after_ms": 4000,
    "routed_to_target": True,
    "source_engines": ["vllm", "sim"],
    "target_engines": ["vllm"],
    "source_takes_bound": True,
}


def test_every_condition_met_gives_the_policy_bound():
    decision = drain_bound(**ALLOWED)
    assert decision.ms == 4000
    assert "4000 ms" in decision.reason


def test_a_bound_of_zero_moves_the_streams_at_once():
    decision = drain_bound(**{**ALLOWED, "after_ms": 0})
    assert decision.ms == 0
    assert "at once" in decision.reason


def test_a_bound_of_zero_still_needs_every_condition():
    decision = drain_bound(**{**ALLOWED, "after_ms": 0, "target_engines": ["sglang"]})
    assert decision.ms is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"after_ms": None}, "stream migration is off"),
        ({"routed_to_target": False}, "routing does not point at the new active"),
        ({"source_engines": ["vllm", "sglang"]}, "old active runs engines that cannot continue"),
        ({"source_engines": ["vllm", None]}, "cannot continue a stream: unknown"),
        ({"target_engines": ["llamacpp"]}, "new active runs engines that cannot continue"),
        ({"source_takes_bound": False}, "does not take a drain bound"),
    ],
)
def test_any_condition_missing_keeps_the_full_drain(change, reason):
    decision = drain_bound(**{**ALLOWED, **change})
    assert decision.ms is None
    assert reason in decision.reason


@pytest.mark.parametrize(
    ("profile", "engine"),
    [({"engine": "vllm"}, "vllm"), ({}, None), ({"engine": ""}, None), ([], None), (None, None)],
)
def test_the_engine_is_read_from_the_bindings_profile(profile, engine):
    assert engine_of(profile) == engine
