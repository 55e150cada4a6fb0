"""The bounded JSON parser both sides use for what they did not write."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.wire.bounded_json import JSONRefused, loads


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


def test_brackets_inside_strings_do_not_count_as_nesting():
    # More brackets than the limit, all inside a string: the walk runs and finds depth 1.
    text = '{"content": "' + "[{" * 50 + '"}'
    assert loads(text, max_depth=2) == {"content": "[{" * 50}


def test_a_repeated_key_deep_inside_is_named_and_the_limit_still_applies():
    with pytest.raises(JSONRefused, match=r"messages\[1\]\.role: duplicate key 'role'"):
        loads('{"messages": [{"role": "a"}, {"role": "b", "role": "c"}]}')
    # A document that is both too deep and repeats a key is refused either way.
    with pytest.raises(JSONRefused):
        loads('{"a": {"a": 1, "a": 2}, "b": [[[[1]]]]}', max_depth=3)


def test_bytes_are_read_as_json_loads_reads_them():
    document = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}
    for encoding in ("utf-8", "utf-16", "utf-32"):
        assert loads(json.dumps(document, ensure_ascii=False).encode(encoding)) == document
    assert loads(bytearray(b'{"a": [1]}')) == {"a": [1]}
    with pytest.raises(JSONRefused, match="not valid JSON"):
        loads(12)  # type: ignore[arg-type]


# What the fast path must agree with: the standard parser, every object checked for repeated
# keys and the whole tree walked for depth.
def _reference(text: str, max_depth: int):
    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate")
        return dict(items)

    value = json.loads(text, object_pairs_hook=pairs)

    def depth(node) -> int:
        if isinstance(node, dict):
            return 1 + max((depth(v) for v in node.values()), default=0)
        if isinstance(node, list):
            return 1 + max((depth(v) for v in node), default=0)
        return 0

    if depth(value) > max_depth:
        raise ValueError("deep")
    return value


_scalars = st.none() | st.booleans() | st.integers() | st.text(alphabet='ab[]{}"\\', max_size=4)
_documents = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.lists(st.tuples(st.sampled_from("abc"), inner), max_size=3)
    ),
    max_leaves=12,
)


def _render(node) -> str:
    # Lists of pairs become objects, so a key may repeat (dicts could not hold that).
    if isinstance(node, list) and node and all(isinstance(x, tuple) for x in node):
        return "{" + ", ".join(f"{json.dumps(k)}: {_render(v)}" for k, v in node) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_render(x) for x in node) + "]"
    if isinstance(node, tuple):
        return "{" + f"{json.dumps(node[0])}: {_render(node[1])}" + "}"
    return json.dumps(node)


@given(document=_documents, max_depth=st.integers(min_value=1, max_value=6))
@settings(max_examples=300, deadline=None)
def test_the_fast_path_agrees_with_walking_every_document(document, max_depth):
    text = _render(document)
    try:
        expected = _reference(text, max_depth)
    except ValueError:
        with pytest.raises(JSONRefused):
            loads(text, max_depth=max_depth)
        return
    assert loads(text, max_depth=max_depth) == expected


@given(
    document=_documents,
    before=st.text(" \t\n\r\x0c", max_size=2),
    after=st.text(" \t\n\r\x0b,x", max_size=2),
)
@settings(max_examples=300, deadline=None)
def test_what_surrounds_a_document_is_read_as_the_standard_parser_reads_it(document, before, after):
    # The common case skips json's decode() for its C scanner: whitespace before or after the
    # value, and anything else after it, must still parse or fail exactly as json.loads does.
    text = before + _render(document) + after
    try:
        expected = json.loads(text)
    except ValueError as exc:
        with pytest.raises(JSONRefused) as refused:
            loads(text, allow_duplicates=True, max_depth=100)
        assert str(refused.value) == f"not valid JSON: {exc}"
        return
    assert loads(text, allow_duplicates=True, max_depth=100) == expected
