"""The weighted split's stored shape and the sticky assignment (fleets/core/route_split.py)."""

from __future__ import annotations

import random
import uuid

import pytest

from fleets.core.route_split import (
    PERMILLE,
    Split,
    SplitInvalid,
    bucket,
    split_parse,
    splits_dump,
    splits_parse,
    to_candidate,
)

ROLLOUT = str(uuid.uuid4())
DOMAIN = str(uuid.uuid4())


def raw(**over):
    return {
        "rollout": ROLLOUT,
        "candidateDomain": DOMAIN,
        "weightPermille": 50,
        "stickyHeader": "",
        **over,
    }


def test_a_split_round_trips_through_its_stored_shape():
    split = split_parse(raw(stickyHeader="x-session-id"))
    assert split == Split(ROLLOUT, DOMAIN, 50, "x-session-id")
    assert splits_parse(splits_dump({"m": split})) == {"m": split}
    assert splits_parse({}) == {} and splits_parse(None) == {}


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"weightPermille": 1001}, "weightPermille"),
        ({"weightPermille": -1}, "weightPermille"),
        ({"weightPermille": True}, "weightPermille"),
        ({"weightPermille": 5.0}, "weightPermille"),
        ({"rollout": "nope"}, "rollout"),
        ({"candidateDomain": None}, "candidateDomain"),
        ({"stickyHeader": "X-Session"}, "stickyHeader"),
        ({"stickyHeader": "a b"}, "stickyHeader"),
        ({"extra": 1}, "unknown keys"),
    ],
)
def test_a_split_the_router_cannot_use_is_refused_naming_the_field(over, field):
    with pytest.raises(SplitInvalid, match=field):
        splits_parse({"m": raw(**over)})


def test_too_many_splits_are_refused():
    with pytest.raises(SplitInvalid, match="at most"):
        splits_parse({f"m{i}": raw() for i in range(65)})


def test_the_bucket_is_stable_and_salted_by_the_rollout():
    assert bucket(ROLLOUT, "key-1") == bucket(ROLLOUT, "key-1")
    other = str(uuid.uuid4())
    keys = [f"key-{i}" for i in range(200)]
    assert [bucket(ROLLOUT, k) for k in keys] != [bucket(other, k) for k in keys]
    assert all(0 <= bucket(ROLLOUT, k) < PERMILLE for k in keys)


def test_one_key_sees_one_arm_and_a_larger_weight_keeps_its_candidates():
    keys = [f"user-{i}" for i in range(2000)]
    low = Split(ROLLOUT, DOMAIN, 50)
    high = Split(ROLLOUT, DOMAIN, 250)
    at_low = {k for k in keys if to_candidate(low, k)}
    at_high = {k for k in keys if to_candidate(high, k)}
    assert at_low <= at_high  # moving the weight up never moves a user back
    assert 50 < len(at_low) < 150 and 400 < len(at_high) < 600
    assert all(to_candidate(low, k) == (k in at_low) for k in keys)


def test_without_a_key_the_share_is_drawn_per_request():
    rng = random.Random(7)
    split = Split(ROLLOUT, DOMAIN, 100)
    hits = sum(to_candidate(split, None, rng) for _ in range(10_000))
    assert 800 < hits < 1200


def test_zero_and_full_weights_never_draw():
    class NoDraw(random.Random):
        def randrange(self, *a, **k):  # noqa: ARG002
            raise AssertionError("drew")

    assert to_candidate(Split(ROLLOUT, DOMAIN, 0), None, NoDraw()) is False
    assert to_candidate(Split(ROLLOUT, DOMAIN, PERMILLE), None, NoDraw()) is True
