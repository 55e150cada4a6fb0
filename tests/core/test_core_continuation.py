"""Stream continuation's pure rules: who continues, what is asked, how the seam is stitched."""

from __future__ import annotations

import pytest

from fleets.core import continuation as rules


@pytest.mark.parametrize(
    ("extra", "endpoint", "reason"),
    [
        ({}, "chat", None),
        ({"temperature": 0.8, "seed": 7}, "chat", None),
        ({"n": 2}, "chat", "n"),
        ({"best_of": 3}, "completions", "n"),
        ({"prompt": ["a", "b"]}, "completions", "n"),
        ({"logprobs": True}, "chat", "logprobs"),
        ({"top_logprobs": 2}, "chat", "logprobs"),
        ({"logprobs": 0}, "completions", "logprobs"),
        ({"echo": True}, "completions", "echo"),
        ({"tools": [{"type": "function"}]}, "chat", "tools"),
        ({"tools": [{"type": "function"}], "tool_choice": "none"}, "chat", None),
        ({"response_format": {"type": "json_object"}}, "chat", "structured"),
        ({"stream_options": {"continuous_usage_stats": True}}, "chat", "usage_per_chunk"),
        ({"stream_options": {"include_usage": True}}, "chat", None),
    ],
)
def test_which_streams_can_continue(extra, endpoint, reason):
    assert rules.refusal({"model": "m", "stream": True, **extra}, endpoint) == reason


def test_only_engines_that_return_ids_continue():
    assert rules.engine_continues("vllm") and rules.engine_continues("sim")
    assert not rules.engine_continues("sglang") and not rules.engine_continues("")


def test_the_continuation_asks_for_the_rest_with_the_same_sampling():
    document = {
        "model": "m",
        "messages": [],
        "max_completion_tokens": 100,
        "min_tokens": 30,
        "temperature": 0,
        "stop": ["\n\n"],
        "seed": 3,
        "stream_options": {"include_usage": True},
    }
    body = rules.continuation_request(document, "chat", "m", [1, 2, 3, 4], 40)
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3, 4],
        "stream": True,
        "return_token_ids": True,
        "max_tokens": 60,
        "temperature": 0,
        "stop": ["\n\n"],
        "seed": 3,
        "stream_options": {"include_usage": True},
    }
    assert (
        rules.continuation_request({**document, "min_tokens": 10}, "chat", "m", [1], 40)[
            "max_tokens"
        ]
        == 60
    )
    assert rules.continuation_request(document, "chat", "m", [1], 100) is None
    assert "max_tokens" not in rules.continuation_request({"model": "m"}, "chat", "m", [1], 5)


def test_min_tokens_shrinks_by_what_was_generated():
    body = rules.continuation_request({"model": "m", "min_tokens": 30}, "completions", "m", [1], 12)
    assert body["min_tokens"] == 18


def test_a_stop_string_split_by_the_seam_is_found():
    hit = rules.stop_across_seam("the end is EN", "D of it", ("END",), include=False)
    assert hit == rules.StopHit(keep=0, stop="END")
    hit = rules.stop_across_seam("the end is E", "ND of it", ("END",), include=True)
    assert hit == rules.StopHit(keep=2, stop="END")


def test_a_stop_in_text_the_first_engine_held_back_is_found():
    # ", " was held back by the first engine (a stop might have completed) and is sent by the
    # proxy at the seam: the continuing engine never sees it joined to its own "ç".
    assert rules.stop_across_seam("Bonjour", ", ça", (", ç",), include=False) == rules.StopHit(
        keep=0, stop=", ç"
    )
    assert rules.stop_across_seam("abc", "def", ("END",), include=False) is None


def test_the_earliest_of_several_stops_wins():
    hit = rules.stop_across_seam("xxAB", "CDEF", ("ABCDEF", "BC"), include=False)
    assert hit == rules.StopHit(keep=0, stop="BC")


def test_holdback_is_vllms_stop_buffer():
    assert rules.holdback({"stop": ["END", "\n\n\n\n"]}) == 3
    assert rules.holdback({"stop": "END", "include_stop_str_in_output": True}) == 0
    assert rules.holdback({}) == 0


def test_an_incomplete_character_and_the_stop_buffer_are_not_sent_yet():
    assert rules.settled_end("ab\ufffd", finished=False, held=0) == 2
    assert rules.settled_end("abcdef", finished=False, held=2) == 4
    assert rules.settled_end("abcdef", finished=True, held=2) == 6


def test_usage_counts_the_whole_answer_once():
    assert rules.usage(21, 300) == {
        "prompt_tokens": 21,
        "total_tokens": 321,
        "completion_tokens": 300,
    }
