"""The layout schema is checked like every operator document: strict numbers, house wording,
and the GPU-index limit written once, as the shared limit."""

from __future__ import annotations

import json

import pytest

from common import limits
from fleets.base.errors import LayoutError
from fleets.layouts.loader import SCHEMA_PATH, layout_schema, parse_layout


def _refused(data) -> list[str]:
    with pytest.raises(LayoutError) as caught:
        parse_layout(data)
    return caught.value.errors


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["domains"][0].update(priority=100.0), "domains[0].priority"),
        (
            lambda d: d["domains"][0]["slots"][0].update(gpuIndex=0.0),
            "domains[0].slots[0].gpuIndex",
        ),
        (
            lambda d: d["domains"][1]["slots"][0]["models"][0].update(memoryMiB=8960.0),
            "domains[1].slots[0].models[0].memoryMiB",
        ),
        (lambda d: d["domains"][0].update(priority=True), "domains[0].priority"),
    ],
)
def test_a_whole_float_or_a_bool_is_not_an_integer_in_a_layout(layout_data, mutate, where):
    mutate(layout_data)
    assert _refused(layout_data) == [f"{where}: must be of type integer"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["domains"][0]["slots"][0]["models"][0].update(
                adapters=[f"a{i}" for i in range(17)]
            ),
            "domains[0].slots[0].models[0].adapters: must have at most 16 item(s)",
        ),
        (
            lambda d: d["domains"][0]["slots"][0]["models"][0].update(adapters=["a", "a"]),
            "domains[0].slots[0].models[0].adapters: must not repeat an entry",
        ),
        (
            lambda d: d["domains"][0]["slots"][0]["models"][0].update(memoryFraction=0),
            "domains[0].slots[0].models[0].memoryFraction: must be greater than 0",
        ),
    ],
)
def test_a_rule_the_schema_does_not_word_is_worded_by_the_house_not_by_jsonschema(
    layout_data, mutate, expected
):
    mutate(layout_data)
    assert _refused(layout_data) == [expected]


def test_the_gpu_index_limit_is_written_once_and_is_the_shared_limit():
    text = SCHEMA_PATH.read_text()
    assert text.count(str(limits.MAX_GPU_INDEX)) == 1
    raw = json.loads(text)["$defs"]
    assert raw["index"]["maximum"] == limits.MAX_GPU_INDEX
    for definition, field in [
        ("inferenceSlot", "gpuIndex"),
        ("trainingSlot", "gpuIndex"),
        ("gpu", "index"),
        ("gpu", "nvlinkGroup"),
        ("gpu", "numaNode"),
    ]:
        assert raw[definition]["properties"][field] == {"$ref": "#/$defs/index"}
        checked = layout_schema()["$defs"][definition]["properties"][field]
        assert checked["maximum"] == limits.MAX_GPU_INDEX


def test_a_gpu_index_past_the_shared_limit_is_refused(layout_data):
    layout_data["domains"][0]["slots"][0]["gpuIndex"] = limits.MAX_GPU_INDEX + 1
    assert _refused(layout_data) == [
        f"domains[0].slots[0].gpuIndex: must be at most {limits.MAX_GPU_INDEX}"
    ]
