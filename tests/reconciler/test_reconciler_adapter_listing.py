"""Reading a supervisor's `GET /v1/adapters` (docs/adapters.md): what is accepted, what is
refused as off the contract."""

from __future__ import annotations

import pytest

from fleets.reconciler.supervisor.reports import MAX_LISTED, parse_adapters, parse_load
from fleets.reconciler.supervisor.transport import BadBody
from tests.reconciler.fake_adapters import make_adapter


def _stored(**over):
    return {
        "id": "a" * 32,
        "digest": "sha256:" + "a" * 64,
        "bytes": 10,
        "origin": "trained",
        "checkpoint": "step-40",
        "storedAt": "2026-12-05T08:00:00Z",
        "manifest": make_adapter("bot")[0],
        **over,
    }


def test_a_listing_reads_stores_incoming_sizes_and_loads_including_unasked_names():
    listing = parse_adapters(
        {
            "adapters": [_stored()],
            "incoming": [{"id": "b" * 32, "files": {"adapter_config.json": 4}}],
            "rejected": [{"checkpoint": "step-1", "why": "no manifest"}],
            "loaded": [
                {"model": "llama-small", "name": "bot@v1", "id": "a" * 32},
                {"model": "llama-small", "name": "by-hand", "id": None},
            ],
        }
    )
    assert listing.stored("a" * 32).origin == "trained"
    assert listing.incoming == {"b" * 32: {"adapter_config.json": 4}}
    assert listing.is_loaded("llama-small", "bot@v1")
    assert listing.is_loaded("llama-small", "by-hand")
    assert not listing.is_loaded("qwen-small", "bot@v1")


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"adapters": [_stored(manifest="nope")]},
        {"adapters": [_stored(bytes=-1)]},
        {"adapters": [_stored()] * (MAX_LISTED + 1)},
        {"incoming": [{"id": "b" * 32, "files": {"x": "lots"}}]},
        {"loaded": [{"model": "llama-small"}]},
    ],
)
def test_a_listing_off_the_contract_is_a_bad_body(body):
    with pytest.raises(BadBody):
        parse_adapters(body)


def test_a_load_answer_says_loaded_or_pending():
    assert parse_load({"model": "m", "name": "n", "loaded": True}).loaded
    ack = parse_load({"model": "m", "name": "n", "loaded": False, "pending": "wake"})
    assert (ack.loaded, ack.pending) == (False, "wake")
    with pytest.raises(BadBody):
        parse_load({"model": "m"})
