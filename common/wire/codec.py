"""One codec between frozen dataclasses and their camelCase JSON objects, for both processes.

A record declares only its fields: each goes on the wire under its name in camelCase
(`used_mib` -> `usedMib`), in the order declared. Where the wire says something else, the field's
annotation carries a `Wire` (`Annotated[int, Wire("usedMiB")]`): another key, a function that
writes or reads the value (timestamps), or `flatten` for a nested record (or a dictionary) whose
keys stand in the parent object itself. Flattened fields come last, as the hand-written maps
this replaces put them.

Values are written as they are, except nested records (their own `to_json` when they have one),
tuples (lists) and mappings (dictionaries). Reading (`from_wire`) is strict where the field's
type says so: a whole number that is no bool (read as an int, the wire's one integer rule), a
string or None, a boolean or None; an unreadable value raises ValueError, a missing required key
KeyError. Each class's plan is worked out once, so a heartbeat's GPU facts cost one loop over a
list, not a walk over type hints.

Pure standard library: the supervisor (on GPU hosts) and the control plane's core both use it.
pydantic (pinned) was weighed: its camelCase generator writes `usedMib` too, it has no
flattening, and the supervisor would carry its validation machinery on every heartbeat for
maps this small.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from common.strict_json import whole_int

T = TypeVar("T")


@dataclass(frozen=True)
class Wire:
    """How one field differs from the default (its name in camelCase, its value as it is)."""

    name: str | None = None
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None
    # The nested record's (or dictionary's) keys are the parent's own.
    flatten: bool = False
    # Kept off the wire (a value the record derives its wire form from); read back as its
    # field's default.
    omit: bool = False


def camel(name: str) -> str:
    """`gpu_instance_id` -> `gpuInstanceId`."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


@dataclass(frozen=True)
class _Field:
    attr: str
    key: str
    wire: Wire
    hint: Any


def _wire_of(hint: Any) -> tuple[Any, Wire]:
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        found = [e for e in extras if isinstance(e, Wire)]
        return base, found[0] if found else Wire()
    return hint, Wire()


# Each class's fields as the wire sees them, worked out on first use.
_PLANS: dict[type, tuple[_Field, ...]] = {}


def _plan(cls: type) -> tuple[_Field, ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        plain: list[_Field] = []
        flat: list[_Field] = []
        for f in dataclasses.fields(cls):
            hint, wire = _wire_of(hints[f.name])
            if wire.omit:
                continue
            key = wire.name or camel(f.name)
            (flat if wire.flatten else plain).append(_Field(f.name, key, wire, hint))
        plan = _PLANS[cls] = (*plain, *flat)
    return plan


_SCALARS = frozenset({str, int, float, bool, type(None)})


def encode(value: Any) -> Any:
    """A value as it goes on the wire."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        to_json = getattr(value, "to_json", None)
        return to_json() if to_json is not None else to_wire(value)
    if isinstance(value, Mapping):
        return {k: encode(v) for k, v in value.items()}
    return value


def to_wire(record: Any) -> dict[str, Any]:
    """The record's JSON object: every field, in the order declared, flattened ones last."""
    out: dict[str, Any] = {}
    for f in _plan(type(record)):
        value = getattr(record, f.attr)
        value = f.wire.encode(value) if f.wire.encode is not None else encode(value)
        if f.wire.flatten:
            out.update(value)
        else:
            out[f.key] = value
    return out


def from_wire(cls: type[T], data: Mapping[str, Any]) -> T:
    """Read a record back from its JSON object (see the module's docstring for how strictly)."""
    values: dict[str, Any] = {}
    for f in _plan(cls):
        if f.wire.flatten:
            values[f.attr] = from_wire(f.hint, data)
            continue
        optional = _is_optional(f.hint)
        raw = data.get(f.key) if optional else data[f.key]
        if f.wire.decode is not None:
            values[f.attr] = f.wire.decode(raw)
        elif raw is None and optional:
            values[f.attr] = None
        else:
            values[f.attr] = _reader(f.hint)(raw)
    return cls(**values)


class WireRecord:
    """`to_json` and `from_json` through the codec, for a dataclass that says nothing more."""

    def to_json(self) -> dict[str, Any]:
        return to_wire(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return from_wire(cls, data)


def _is_optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _reader(hint: Any) -> Callable[[Any], Any]:
    if _is_optional(hint):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is int:
        return read_int
    if hint is bool:
        return read_bool
    if hint is str:
        return read_str
    if typing.get_origin(hint) is tuple:
        item = _reader(typing.get_args(hint)[0])
        return lambda value: tuple(item(v) for v in read_list(value))
    raise TypeError(f"no wire reader for {hint!r}: give the field a Wire(decode=...)")


def read_int(value: Any) -> int:
    """The wire's one integer rule: a whole number (`4.0` too) is read as its int."""
    number = whole_int(value)
    if number is None:
        raise ValueError(f"not an integer: {value!r}")
    return number


def read_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not a string: {value!r}")
    return value


def read_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"not a boolean: {value!r}")
    return value


def read_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"not a list: {value!r}")
    return value
