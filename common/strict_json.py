"""JSON value kinds, the refused-document error, and the supervisor API's request reader.

Operator documents (the supervisor config and its engine profiles) are JSON Schema files checked
through `common/documents.py`, which takes "an int but not a bool" from here. `ObjectReader`
reads the few fields of the supervisor API's request bodies (`supervisor/api.py`); those bodies'
schemas are the wire contract's (`common/wire/schemas/`), which the supervisor does not yet
enforce itself.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any, TypeGuard

_MISSING = object()


def child_path(path: str, key: str | int) -> str:
    """Extend a JSON path by an object key or a list index."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class ConfigError(Exception):
    """Refuse a document; holds every `path: rule` message found, not just the first."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))

    def render(self) -> str:
        """Format the errors one per line for a terminal."""
        return "\n".join(f"  - {e}" for e in self.errors)


class ObjectReader:
    """Take fields out of one JSON object, recording type and range errors.

    Call `finish()` last: any field that was never read is unknown and refused, which is what
    makes the formats strict.
    """

    def __init__(self, data: Any, path: str, errors: list[str]) -> None:
        self.path = path
        self.errors = errors
        self.ok = isinstance(data, dict)
        self._data: dict[str, Any] = data if isinstance(data, dict) else {}
        self._seen: set[str] = set()
        if not self.ok:
            self.error("", f"must be an object, got {type_name(data)}")

    def error(self, key: str | int, rule: str) -> None:
        """Record a rule broken at this object's field (or at the object itself for "")."""
        where = child_path(self.path, key) if key != "" else (self.path or "(root)")
        self.errors.append(f"{where}: {rule}")

    def has(self, key: str) -> bool:
        return key in self._data

    def raw(self, key: str, *, required: bool = False) -> Any:
        """Return a field untouched, or `_MISSING`."""
        self._seen.add(key)
        if key not in self._data:
            if required:
                self.error(key, "is required")
            return _MISSING
        return self._data[key]

    def _typed(
        self,
        key: str,
        required: bool,
        check: Callable[[Any], bool],
        expected: str,
        allow_null: bool,
    ) -> tuple[bool, Any]:
        """Return (provided, value); a missing, null-when-allowed or mistyped field is not."""
        value = self.raw(key, required=required)
        if value is _MISSING or (value is None and allow_null):
            return False, None
        if not check(value):
            self.error(key, f"must be {expected}, got {type_name(value)}")
            return False, None
        return True, value

    def str(
        self,
        key: builtins.str,
        *,
        required: builtins.bool = False,
        default: builtins.str | None = None,
        allow_null: builtins.bool = False,
    ) -> builtins.str | None:
        ok, value = self._typed(key, required, lambda v: isinstance(v, str), "a string", allow_null)
        if not ok:
            return default
        if not value.strip():
            self.error(key, "must not be empty")
            return default
        return value

    def int(
        self,
        key: builtins.str,
        *,
        required: builtins.bool = False,
        default: builtins.int | None = None,
        minimum: builtins.int | None = None,
        maximum: builtins.int | None = None,
        allow_null: builtins.bool = False,
    ) -> builtins.int | None:
        ok, value = self._typed(key, required, is_int, "an integer", allow_null)
        if not ok:
            return default
        if minimum is not None and value < minimum:
            self.error(key, f"must be at least {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.error(key, f"must be at most {maximum}, got {value}")
            return default
        return value

    def list(
        self,
        key: builtins.str,
        *,
        required: builtins.bool = False,
        allow_null: builtins.bool = False,
    ) -> builtins.list | None:
        ok, value = self._typed(key, required, lambda v: isinstance(v, list), "a list", allow_null)
        return value if ok else None

    def str_list(
        self,
        key: builtins.str,
        *,
        required: builtins.bool = False,
        non_empty_items: builtins.bool = True,
    ) -> builtins.list[builtins.str] | None:
        items = self.list(key, required=required)
        if items is None:
            return None
        out: list[str] = []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.error(key, f"item {i} must be a string, got {type_name(item)}")
                return None
            if non_empty_items and item == "":
                self.error(key, f"item {i} must not be empty")
                return None
            out.append(item)
        return out

    def finish(self) -> None:
        """Refuse every field that no reader asked for."""
        for key in self._data:
            if key not in self._seen:
                self.error(key, "is not a known field")


def is_int(value: Any) -> TypeGuard[int]:
    """Accept JSON integers only; `true` is not 1 here."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def type_name(value: Any) -> str:
    """Name a JSON value's type the way an operator reads it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
