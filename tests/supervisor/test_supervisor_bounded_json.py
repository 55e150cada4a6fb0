"""The bounded JSON parser both sides use for what they did not write."""

from __future__ import annotations

import pytest

from supervisor.wire.bounded_json import JSONRefused, loads


def test_a_hundred_thousand_brackets_are_a_clean_refusal_not_a_recursion_error():
    with pytest.raises(JSONRefused, match="nested deeper than"):
        loads("[" * 100_000)


def test_nesting_past_the_limit_is_refused_with_its_path():
    with pytest.raises(JSONRefused, match=r"a\[0\]\[0\]: nested deeper than 3 levels"):
        loads('{"a": [[[1]]]}', max_depth=3)
    assert loads('{"a": [[1]]}', max_depth=3) == {"a": [[1]]}


def test_a_repeated_key_is_refused_with_its_path():
    with pytest.raises(JSONRefused, match=r"policy\.autoFailover: duplicate key"):
        loads('{"policy": {"autoFailover": true, "autoFailover": false}}')
    assert loads('{"a": 1, "a": 2}', allow_duplicates=True) == {"a": 2}


def test_bad_json_is_a_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="not valid JSON"):
        loads(b"{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        loads(b"\xff\xfe")
