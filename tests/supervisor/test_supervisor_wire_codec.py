"""The dataclass <-> camelCase JSON codec (common/wire/codec.py) both processes write with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest

from common.wire.codec import Wire, WireRecord, camel, from_wire, to_wire


@dataclass(frozen=True)
class Inner(WireRecord):
    pid: int
    boot_id: str | None


@dataclass(frozen=True)
class Outer(WireRecord):
    gpu_index: int
    inner: Annotated[Inner, Wire(flatten=True)]
    used_mib: Annotated[int, Wire("usedMiB")]
    command: tuple[str, ...] = ()
    sleeping: bool | None = None


@dataclass(frozen=True)
class Open:
    index: int
    extra: Annotated[dict[str, Any], Wire(flatten=True)] = field(default_factory=dict)
    name: str | None = None


def test_camel_case():
    assert camel("gpu_instance_id") == "gpuInstanceId"
    assert camel("p95_ms") == "p95Ms"
    assert camel("pid") == "pid"


def test_fields_in_order_renamed_where_declared_and_flattened_last():
    record = Outer(2, Inner(7, None), 300, ("a", "b"))
    assert list(record.to_json().items()) == [
        ("gpuIndex", 2),
        ("usedMiB", 300),
        ("command", ["a", "b"]),
        ("sleeping", None),
        ("pid", 7),
        ("bootId", None),
    ]
    assert list(to_wire(Open(1, {"temp": 40}, "x"))) == ["index", "name", "temp"]


def test_reading_back_is_strict_by_type():
    data = {"gpuIndex": 2, "usedMiB": 300, "command": ["a"], "pid": 7, "bootId": "b"}
    assert from_wire(Outer, data) == Outer(2, Inner(7, "b"), 300, ("a",))
    with pytest.raises(ValueError):
        Outer.from_json({**data, "gpuIndex": True})
    with pytest.raises(ValueError):
        Outer.from_json({**data, "command": "a"})
    with pytest.raises(ValueError):
        Outer.from_json({**data, "sleeping": "yes"})
    with pytest.raises(KeyError):
        Outer.from_json({k: v for k, v in data.items() if k != "pid"})


def test_a_type_without_a_reader_says_so():
    @dataclass(frozen=True)
    class Odd:
        at: float

    assert to_wire(Odd(1.5)) == {"at": 1.5}
    with pytest.raises(TypeError, match="Wire\\(decode=...\\)"):
        from_wire(Odd, {"at": 1.5})


def test_a_whole_number_reads_as_its_int_as_everywhere_on_the_wire():
    data = {"gpuIndex": 2.0, "usedMiB": 300, "command": ["a"], "pid": 7.0, "bootId": "b"}
    read = from_wire(Outer, data)
    assert read == Outer(2, Inner(7, "b"), 300, ("a",)) and type(read.gpu_index) is int
    with pytest.raises(ValueError):
        Outer.from_json({**data, "gpuIndex": 2.5})
