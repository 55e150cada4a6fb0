"""The adapter answer's renaming, byte by byte: `model` back to the name the client asked for."""

from __future__ import annotations

import json

import pytest

from fleets.proxy.adapters import Renamer

EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","created":1,'
    b'"model":"support-bot@v12","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
)
RENAMED = EVENT.replace(b"support-bot@v12", b"support-bot")


def test_every_event_is_renamed_and_nothing_else_changes():
    renamer = Renamer("support-bot")
    stream = EVENT * 3 + b"data: [DONE]\n\n"
    assert renamer.feed(stream) + renamer.flush() == RENAMED * 3 + b"data: [DONE]\n\n"


@pytest.mark.parametrize("cut", range(1, len(EVENT)))
def test_a_field_cut_between_two_reads_is_renamed_whole(cut):
    renamer = Renamer("support-bot")
    first = renamer.feed(EVENT[:cut])
    assert RENAMED.startswith(first)  # what went out already is final
    assert first + renamer.feed(EVENT[cut:]) + renamer.flush() == RENAMED


def test_an_event_end_is_never_held_back():
    renamer = Renamer("support-bot")
    assert renamer.feed(EVENT) == RENAMED and renamer.tail == b""


def test_other_names_and_the_content_are_left_alone():
    renamer = Renamer("support-bot")
    body = json.dumps(
        {
            "model": "support-bot-2@v3",
            "choices": [{"message": {"content": 'say "model":"support-bot@v9"'}}],
        },
        separators=(",", ":"),
    ).encode()
    # The content's quotes are escaped in JSON: the pattern cannot match inside a string.
    assert renamer.feed(body) + renamer.flush() == body


def test_a_spaced_field_is_renamed():
    renamer = Renamer("bot")
    assert renamer.feed(b'{"model": "bot@v3", "x": 1}') + renamer.flush() == (
        b'{"model": "bot", "x": 1}'
    )


def test_a_digit_leading_name_is_not_read_as_a_group_reference():
    renamer = Renamer("1bot")
    assert renamer.feed(b'{"model":"1bot@v2"}') == b'{"model":"1bot"}'
