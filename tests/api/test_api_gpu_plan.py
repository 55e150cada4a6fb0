"""The fleet snapshot carries the GPU plan: layout, slot spans and allocations, memory requests."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_snapshot_shows_each_slots_gpus_and_what_the_plan_granted(seeded_fleet, client_with_token):
    body = client_with_token.get("/v1/fleets/demo").json()
    east = next(d for d in body["domains"] if d["slug"] == "east")
    assert east["gpuLayout"] == {
        "gpus": [{"count": 1, "type": "SIM-H100-80GB", "memoryMiB": 81920}],
        "placementPolicy": "binpack",
    }
    slots = {s["kind"]: s for s in east["slots"]}
    inference, training = slots["inference"], slots["training"]
    assert (inference["gpuIndices"], inference["migInstance"]) == ([0], None)
    assert inference["allocation"]["servers"]["qwen-small"] == {
        "needMiB": 6964,
        "gpuMemoryUtilization": 0.085,
        "sleepResidueMiB": 768,
    }
    assert training["allocation"] == {"budgetMiB": 40960, "pinned": False}
    qwen = next(m for m in inference["models"] if m["name"] == "qwen-small")
    assert qwen["memory"] == {"memoryMiB": 6912, "sleepResidueMiB": 768}


def test_openapi_documents_the_plan_fields(client_with_token):
    schema = client_with_token.get("/v1/openapi.json").json()
    slot = schema["components"]["schemas"]["SlotOut"]["properties"]
    assert {"gpuIndices", "migInstance", "allocation"} <= set(slot)
    assert "gpuLayout" in schema["components"]["schemas"]["DomainOut"]["properties"]
